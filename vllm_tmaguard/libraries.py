"""Where the package's built libraries are (setup.py builds them into vllm_tmaguard/lib/)."""

from __future__ import annotations

import os

LIBRARY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
SHIM_FILES = {"encoders": "libtmaguard_encoders.so", "proc-address": "libtmaguard_proc_address.so"}
OVERLAY_FILE = "libtmaguard_overlay.so"


def shim_path(library: str) -> str:
    return os.path.join(LIBRARY_DIR, SHIM_FILES[library])


def overlay_path() -> str:
    return os.path.join(LIBRARY_DIR, OVERLAY_FILE)
