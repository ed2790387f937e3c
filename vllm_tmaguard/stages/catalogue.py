"""One catalogue of the names this package reasons about: the driver entry points it supplies, the libraries
it builds, and the marker by which it recognises them (docs/design.md §2.2, §2.6)."""

from __future__ import annotations

import os

DRIVER_LIBRARY = "libcuda.so.1"

ENCODERS = (
    "cuTensorMapEncodeTiled",
    "cuTensorMapEncodeIm2col",
    "cuTensorMapEncodeIm2colWide",
    "cuTensorMapReplaceAddress",
)
PROC_ADDRESS_V2 = "cuGetProcAddress_v2"
LAUNCH_EX = "cuLaunchKernelEx"

# Entry points looked up in libcuda.so.1's own handle, which an RTLD_GLOBAL shim cannot answer, and who asks.
HANDLE_SCOPED = {
    PROC_ADDRESS_V2: "the CUDA runtime 12+ (torch, cuBLAS) looks it up in libcuda.so.1's handle",
    LAUNCH_EX: "Triton looks it up in libcuda.so.1's handle for every launch",
}
# A libcuda.so.1 lacking any of these needs the overlay: it was built against headers older than CUDA 12, so
# it also lacks what cuBLASLt's raw table and the CUDA runtime ask it for (the overlay carries every driver
# symbol of the CUDA 13 headers, csrc/driver_symbols.h).
OVERLAY_TRIGGERS = (ENCODERS[0], PROC_ADDRESS_V2, LAUNCH_EX)

# Exported by every library this package builds (csrc/common.c): how the guard recognises its own overlay.
MARKER = "tmaguard_shim_source"

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY_DIR = os.path.join(PACKAGE_DIR, "lib")
OVERLAY_FILE = "libtmaguard_overlay.so"
SHIM_FILES = {"encoders": "libtmaguard_encoders.so", "proc-address": "libtmaguard_proc_address.so"}
# What each shim exports: the names vLLM's extensions bind through the global scope.
SHIM_SYMBOLS = {"encoders": ENCODERS, "proc-address": (PROC_ADDRESS_V2,)}


def shim_path(library: str) -> str:
    return os.path.join(LIBRARY_DIR, SHIM_FILES[library])


def overlay_path() -> str:
    return os.path.join(LIBRARY_DIR, OVERLAY_FILE)
