"""The cheap question asked when torch is imported before vLLM: would the guard have anything to load here?
torch maps libcuda.so.1 on import, after which the overlay can no longer become the process's
libcuda.so.1, so where the layer lacks entry points the guard must run first. Answered from the files alone,
like the guard's own probes (no load, no call into the layer)."""

from __future__ import annotations

import importlib.machinery
import os
from collections.abc import Mapping

from ..codes import FOUND_MAPPED
from ..loaded import read_loaded_objects
from .catalogue import DRIVER_LIBRARY, OVERLAY_TRIGGERS
from .elf import ElfError, read_elf
from .layers import is_vcuda_build
from .loader import resolve_library


def vllm_installed() -> bool:
    """vLLM is importable from sys.path (found without importing it, and without this hook's finder)."""
    return importlib.machinery.PathFinder.find_spec("vllm") is not None


def guard_needed_before(environ: Mapping[str, str]) -> bool:
    """libcuda.so.1, as the loader would pick it now, is a file that lacks what the guard supplies, or a vCUDA
    build whose look-ups the guard's overlay answers instead."""
    if environ.get("TMAGUARD_MODE", "").strip().lower() == "off":
        return False
    root = environ.get("TMAGUARD_ROOT") or "/"
    resolution = resolve_library(DRIVER_LIBRARY, environ, root, read_loaded_objects())
    if resolution.path is None or resolution.how == FOUND_MAPPED:
        return False  # nothing to load a library in front of, or too late: the guard says so at vLLM's import
    try:
        info = read_elf(resolution.path, prefixes=(b"cu", b"g_vcuda"))
    except ElfError:
        return False
    return is_vcuda_build(info) or not all(name in info.defined for name in OVERLAY_TRIGGERS)


def torch_first_needs_guard() -> bool:
    return vllm_installed() and guard_needed_before(os.environ)
