"""This process, as the guard sees and changes it. Read passively (nothing loaded or imported): the shared
objects the dynamic loader has loaded (its own list, or /proc/self/maps); where a
package would be imported from. Changed only here: a library loaded, a module kept from importing (the
environment variables the guard sets are os.environ's). Standard library only: the verdict cache
(verdict.py) uses it in every vLLM process; actions.py decides what to change."""

import functools
import importlib.machinery
import os
import sys
from typing import Any

from . import files

LIBRARY_PATH = "LD_LIBRARY_PATH"


def split_library_path(value: str, cwd: str) -> list[str]:
    """LD_LIBRARY_PATH as glibc reads it: ':' or ';' separated; an empty entry means the current directory."""
    if not value:
        return []
    entries = value.replace(";", ":").split(":")
    return [os.path.join(cwd, entry) if not os.path.isabs(entry) else entry for entry in entries]


def working_directory() -> str:
    """The current directory; "" where it is gone (removed under the process): a relative LD_LIBRARY_PATH
    entry then stays relative and finds nothing, as the loader finds nothing in a directory that is gone."""
    try:
        return os.getcwd()
    except OSError:
        return ""


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


def find_package_dirs(name: str, search_path: list[str] | None = None) -> list[str]:
    """Every directory of the package (several for a namespace package such as `cuda` or `nvidia`), located
    like `import` would, without executing it (and without meta-path hooks, so the guard's own import hook
    is not re-entered). `search_path`: instead of sys.path."""
    spec = importlib.machinery.PathFinder.find_spec(name, sys.path if search_path is None else search_path)
    if spec is None or not spec.submodule_search_locations:
        return []
    return list(spec.submodule_search_locations)


def find_package_dir(name: str = "vllm", search_path: list[str] | None = None) -> str | None:
    """The package's (first) directory; see find_package_dirs."""
    return next(iter(find_package_dirs(name, search_path)), None)


def load_library(path: str, global_scope: bool = False) -> int:
    """dlopen(path, RTLD_NOW, and RTLD_GLOBAL if asked); its handle. Raises OSError."""
    import ctypes

    return ctypes.CDLL(path, mode=os.RTLD_NOW | (os.RTLD_GLOBAL if global_scope else 0))._handle


def answering(name: str) -> int | None:
    """The handle dlopen(name) gives from now on, if a loaded object answers that name (RTLD_NOLOAD: loads
    nothing)."""
    import ctypes

    try:
        return ctypes.CDLL(name, mode=os.RTLD_NOW | os.RTLD_NOLOAD)._handle
    except OSError:
        return None


def block_import(module: str) -> bool:
    """Makes `import module` raise ImportError (Python's documented None entry in sys.modules), as if the
    extension had failed to load; False if it is already imported."""
    if sys.modules.get(module) is not None:
        return False
    sys.modules[module] = None  # type: ignore[assignment]
    return True


def add_arg(flag: str, value: str) -> bool:
    """Adds `flag value` to the command line vLLM's parser reads after the guard (sys.argv), unless the flag
    is there already; False then. vLLM's parser takes the last of a repeated flag, so nothing the user wrote
    is ever overridden by this."""
    if any(arg == flag or arg.startswith(flag + "=") for arg in sys.argv[1:]):
        return False
    sys.argv.extend([flag, value])
    return True


def module_run() -> str | None:
    """The module `python -m` runs in this process, from /proc/self/cmdline (sys.argv[0] is "-m" while its
    package is imported, when the guard runs); None for any other command."""
    from .files import read_bytes

    try:  # /proc/self is this process itself, not a verdict input (docs/design.md §4.1)
        words = read_bytes("/proc/self/cmdline", 1 << 20, noted=False).split(b"\0")
    except OSError:
        return None
    for index, word in enumerate(words[1:], start=1):
        if word == b"-m" and index + 1 < len(words):
            return words[index + 1].decode(errors="replace")
        if not word.startswith(b"-"):
            return None
    return None
