"""The shared objects this process has loaded, read passively (nothing loaded or imported): asked of the
dynamic loader itself (dl_iterate_phdr), else read from /proc/self/maps; and the files among them named like
a library (the layer, the real driver behind it, this package's overlay). The full run's; a replay asks only
where the driver's name already answers in this process (verdict._loaded_as), so apart from process.py,
which every vLLM process imports."""

from __future__ import annotations

import functools
import os
from typing import Any

from . import files


def mapped_files(maps_text: str) -> list[str]:
    """Distinct file paths mapped into a process, in order of first appearance, from /proc/PID/maps."""
    seen: dict[str, None] = {}
    for line in maps_text.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            seen.setdefault(fields[5].removesuffix(" (deleted)"), None)
    return list(seen)


def read_loaded_objects() -> str | None:
    """The files the dynamic loader has loaded into this process, one /proc/PID/maps-style line each (for
    mapped_files): what dlopen answers from. Asked of the loader itself (dl_iterate_phdr, passive: loads
    nothing), or where ctypes cannot, read from /proc/self/maps; None if neither can be read."""
    loaded = _loaded_objects()
    if loaded is not None:
        return "".join(f"0-0 r--p 00000000 00:00 0 {path}\n" for path in loaded)
    try:  # this process's own map: never a verdict input (the mapped files are: verdict.observe_process)
        return files.read_bytes("/proc/self/maps", noted=False).decode("utf-8", "surrogateescape")
    except OSError:
        return None


@functools.cache
def _iterate_phdr() -> tuple[Any, Any]:
    """dl_iterate_phdr with the GIL held through the call (PyDLL): no other Python thread runs, so none can
    be inside dlopen waiting for the loader's lock the iteration holds while the callback waits for the
    GIL. The C types are made once (each costs more than the iteration itself)."""
    import ctypes

    class Info(ctypes.Structure):  # the leading fields of struct dl_phdr_info
        _fields_ = [("addr", ctypes.c_size_t), ("name", ctypes.c_char_p)]

    callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Info), ctypes.c_size_t, ctypes.c_void_p)
    iterate = ctypes.PyDLL(None).dl_iterate_phdr
    iterate.argtypes = [callback_type, ctypes.c_void_p]
    return iterate, callback_type


def _loaded_objects() -> list[str] | None:
    try:
        iterate, callback_type = _iterate_phdr()
    except (ImportError, OSError, AttributeError):
        return None
    names: list[bytes] = []

    def collect(info, size, data):  # type: ignore[no-untyped-def]
        names.append(info.contents.name or b"")
        return 0

    iterate(callback_type(collect), None)
    return [os.fsdecode(name) for name in names if name.startswith(b"/")]


def mapped_named(name: str, maps_text: str | None) -> tuple[str, ...]:
    """Every mapped file whose name starts like library `name` ("libcuda.so.1" -> libcuda.so.*): the layer
    and the real driver behind it, or this package's overlay."""
    stem = name.split(".so")[0] + "."
    if not maps_text or stem not in maps_text:
        return ()
    return tuple(path for path in mapped_files(maps_text) if os.path.basename(path).startswith(stem))
