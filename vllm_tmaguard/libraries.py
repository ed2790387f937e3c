"""Where the package's built libraries are (setup.py builds them into vllm_tmaguard/lib/)."""

from __future__ import annotations

import os

LIBRARY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
SHIM_FILES = {"encoders": "libtmaguard_encoders.so", "proc-address": "libtmaguard_proc_address.so"}
OVERLAY_GROUP_CODES = {"encoders": "enc", "proc-address": "pa2", "launch-ex": "lex"}


def shim_path(library: str) -> str:
    return os.path.join(LIBRARY_DIR, SHIM_FILES[library])


def overlay_path(groups: frozenset[str]) -> str:
    codes = [code for group, code in OVERLAY_GROUP_CODES.items() if group in groups]
    return os.path.join(LIBRARY_DIR, f"libtmaguard_overlay_{'-'.join(codes)}.so")
