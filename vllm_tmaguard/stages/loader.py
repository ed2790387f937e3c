"""Which file answers dlopen("libcuda.so.1") in this process, worked out the way glibc's loader does it,
without loading anything, and where the real driver behind a sharing layer is. Fixed system paths are read
under a root prefix (TMAGUARD_ROOT); paths that come from the environment (LD_LIBRARY_PATH) and /proc are
taken as they are.

The loader's search order for a bare library name (search_order):
  1. an object already mapped into the process under that name (resolve_library)
  2. LD_LIBRARY_PATH, in order
  3. /etc/ld.so.cache
  4. the default directories

The real driver's search order behind a layer (real_driver_search):
  1. beside the layer (vCUDA keeps libcuda.so.<version> there and opens it by that name)
  2. LD_LIBRARY_PATH
  3. the directories ld.so.cache names for libcuda.so.1
  4. the usual driver directories (DRIVER_DIRS)
  Within a directory: the version of the running kernel module first, then the newest."""

import os
import re
import struct
from collections.abc import Iterable, Mapping

from .. import files
from ..codes import FOUND_DEFAULT_DIRS, FOUND_LD_SO_CACHE, FOUND_LIBRARY_PATH, FOUND_MAPPED, FOUND_NOTHING
from ..loaded import mapped_named
from ..process import LIBRARY_PATH, split_library_path
from . import door
from .catalogue import DRIVER_LIBRARY, ENCODERS, MARKER
from .elf import ElfError, ElfInfo, native_machine, read_elf
from .values import value_type

_NEW_CACHE_MAGIC = b"glibc-ld.so.cache1.1"
_CACHE_HEADER = struct.Struct("<20sIIB3xI12x")  # magic, nlibs, len_strings, flags, extension offset
_CACHE_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
# The architecture bits of an entry's flags (glibc's ldconfig.h), for the machines we build for.
_CACHE_ARCH_FLAGS = {"x86_64": 0x0300, "aarch64": 0x0A00}
_DEFAULT_DIRS = {"x86_64": ("/lib64", "/usr/lib64"), "aarch64": ("/lib64", "/usr/lib64")}


@value_type
class LibraryResolution:
    name: str
    path: str | None  # the file the loader gives (or gave) for `name`; None: not found
    how: str  # the search step that gave `path`: codes.FOUND_*
    mapped: tuple[str, ...]  # every mapped file whose name starts like `name` (e.g. a layer and the driver)
    skipped: tuple[str, ...] = ()  # candidates the loader would pass over, with why


def working_directory() -> str:
    """The current directory; "" where it is gone (removed under the process): a relative LD_LIBRARY_PATH
    entry then stays relative and finds nothing, as the loader finds nothing in a directory that is gone."""
    try:
        return os.getcwd()
    except OSError:
        return ""


def under_root(root: str, path: str) -> str:
    return path if root in ("", "/") else os.path.join(root, path.lstrip("/"))


def read_ld_so_cache(data: bytes, machine: str, name: str | None = None) -> list[tuple[str, str]]:
    """(library name, path) pairs for this machine's architecture from an ld.so.cache image, in cache order;
    only those for library `name` if given (compared before decoding: every process reads the cache).

    Handles the new format alone or appended to the old one; returns [] for anything it does not know."""
    start = data.find(_NEW_CACHE_MAGIC)
    if start < 0 or start + _CACHE_HEADER.size > len(data):
        return []
    _, count, _, _, _ = _CACHE_HEADER.unpack_from(data, start)
    arch = _CACHE_ARCH_FLAGS.get(machine)
    entries_at = start + _CACHE_HEADER.size
    count = min(count, (len(data) - entries_at) // _CACHE_ENTRY.size)
    wanted = None if name is None else name.encode() + b"\0"
    entries = memoryview(data)[entries_at : entries_at + count * _CACHE_ENTRY.size]
    pairs = []
    for flags, key, value, _, _ in _CACHE_ENTRY.iter_unpack(entries):
        if arch is not None and flags & 0xFF00 != arch:
            continue
        if wanted is not None and not data.startswith(wanted, start + key):
            continue
        pairs.append((_c_string(data, start + key), _c_string(data, start + value)))
    return pairs


_MAX_CACHE_STRING = 4096  # PATH_MAX: bounds the scan for a terminator in a corrupt cache


def _c_string(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset, offset + _MAX_CACHE_STRING)
    return data[offset:end].decode("utf-8", "replace") if 0 <= offset < end else ""


def _usable(path: str, machine: int | None) -> ElfInfo | str:
    """The file's ELF facts if the loader would take it, else why it would pass over it."""
    try:
        info = read_elf(path, symbols=False)
    except ElfError as error:
        return error.why
    if machine is not None and info.machine != machine:
        return f"built for machine {info.machine}, not this one"
    return info


def _passes_over(path: str, machine: int | None) -> str | None:
    """Why glibc's loader would go on to the next candidate (its open_verify), or None if it stops at this
    file. It passes over a file it may not open and an ELF file of the other class or another machine;
    any other flaw (too short, not ELF, the wrong byte order...) fails the load right there, so that
    file, broken or not, is the answer: the guard must not pick a later one the loader would never reach."""
    try:
        header = door.read_head(path, 64)
    except (PermissionError, FileNotFoundError) as error:
        return error.strerror or str(error)
    except OSError:
        return None  # e.g. a directory: open succeeds in the loader, the read fails and stops it
    if len(header) < 64 or header[:4] != b"\x7fELF":
        return None
    if header[4] == 1:  # the loader's "wrong ELF class": we only build for 64-bit machines
        return "a 32-bit ELF file, not for this 64-bit machine"
    if header[4] != 2:
        return f"unknown ELF class/byte order ({header[4]}/{header[5]})"
    if header[5] != 1 or machine is None:  # a big-endian file stops the loader
        return None
    found = int.from_bytes(header[18:20], "little")
    return f"built for machine {found}, not this one" if found != machine else None


def search_order(
    name: str, environ: Mapping[str, str], root: str, cwd: str, machine: str
) -> Iterable[tuple[str, str]]:
    """(candidate path, how) in the order glibc's loader tries them for a bare library name."""
    for directory in split_library_path(environ.get(LIBRARY_PATH, ""), cwd):
        yield os.path.join(directory, name), FOUND_LIBRARY_PATH
    try:
        cache = files.read_bytes(under_root(root, "/etc/ld.so.cache"))
    except OSError:
        cache = b""
    for _, path in read_ld_so_cache(cache, machine, name):
        yield under_root(root, path), FOUND_LD_SO_CACHE
    for directory in _DEFAULT_DIRS.get(machine, ("/lib", "/usr/lib")):
        yield under_root(root, os.path.join(directory, name)), FOUND_DEFAULT_DIRS


def resolve_library(
    name: str,
    environ: Mapping[str, str],
    root: str = "/",
    maps_text: str | None = None,
    cwd: str | None = None,
) -> LibraryResolution:
    """The file `dlopen(name)` gives this process now. Reads files only; loads nothing."""
    machine = os.uname().machine
    elf_machine = native_machine()
    mapped = mapped_named(name, maps_text)
    skipped: list[str] = []
    first_found: tuple[str, str] | None = None
    for path, how in search_order(name, environ, root, cwd or working_directory(), machine):
        if how == FOUND_LIBRARY_PATH and "$" in path:  # $ORIGIN, $LIB, $PLATFORM: the loader expands them
            skipped.append(f"{os.path.dirname(path)}: the loader expands its $ token, the guard cannot")
            break  # whatever follows, the guard cannot tell which file the loader takes
        if door.stat(path) is None:
            continue
        passed_over = _passes_over(path, elf_machine)
        if passed_over is not None:
            skipped.append(f"{path}: {passed_over}")
            continue
        first_found = (path, how)
        break
    if mapped:
        return LibraryResolution(
            name, _answering_mapped(name, mapped, first_found), FOUND_MAPPED, mapped, tuple(skipped)
        )
    if first_found:
        return LibraryResolution(name, first_found[0], first_found[1], mapped, tuple(skipped))
    return LibraryResolution(name, None, FOUND_NOTHING, mapped, tuple(skipped))


def _answering_mapped(name: str, mapped: tuple[str, ...], first_found: tuple[str, str] | None) -> str:
    """Of the mapped candidates, the one a later dlopen(name) gets: the file the search order finds if it
    is mapped (it was loaded through the name), else one mapped under the name itself (a layer installed as
    a hard link), else one whose SONAME is the name (the real driver behind a symlink)."""
    if first_found:
        found = files.realpath(first_found[0])
        for path in mapped:
            if files.realpath(path) == found:
                return path
    for path in mapped:
        if os.path.basename(path) == name:
            return path
    for path in mapped:
        usable = _usable(path, None)
        if isinstance(usable, ElfInfo) and usable.soname == name:
            return path
    return mapped[0]


# Where NVIDIA's container toolkit and distributions put the driver (read under TMAGUARD_ROOT).
DRIVER_DIRS = (
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib/wsl/lib",
)
_DRIVER_FILE = re.compile(r"^libcuda\.so\.(\d+(?:\.\d+)+)$")


def real_driver_search(layer_path: str, environ: Mapping[str, str], root: str) -> list[tuple[str, str]]:
    """(directory, step) in the order this module's docstring gives, each directory once."""
    steps = [
        (os.path.dirname(layer_path), "beside the layer"),
        (os.path.dirname(files.realpath(layer_path)), "beside the layer"),
        *(
            (d, "LD_LIBRARY_PATH")
            for d in split_library_path(environ.get(LIBRARY_PATH, ""), working_directory())
        ),
        *(
            (os.path.dirname(path), "ld.so.cache")
            for path, how in search_order(DRIVER_LIBRARY, {}, root, "/", os.uname().machine)
            if how == FOUND_LD_SO_CACHE
        ),
        *((under_root(root, d), "driver directories") for d in DRIVER_DIRS),
    ]
    first: dict[str, str] = {}
    for directory, step in steps:
        first.setdefault(directory, step)
    return list(first.items())


def find_real_driver(
    layer: ElfInfo, driver_version: str | None, environ: Mapping[str, str], root: str
) -> tuple[str | None, str]:
    """The real driver file behind `layer`: a libcuda.so.<version> (or libcuda.so.1) with SONAME
    libcuda.so.1 that exports the encoders and is neither the layer nor this package's overlay, from the
    first directory of real_driver_search that has one; and the last search step it looked in (what of the
    environment it read: a step after "beside the layer" read LD_LIBRARY_PATH)."""
    layer_real = files.realpath(layer.path)
    step = "beside the layer"
    for directory, step in real_driver_search(layer.path, environ, root):
        candidates = [
            (version == driver_version, _version_key(version), path)
            for path, version in _driver_files(directory)
            if files.realpath(path) != layer_real
        ]
        for _, _, path in sorted(candidates, reverse=True):
            try:
                info = read_elf(path, prefixes=(b"cuTensorMap", MARKER.encode()))
            except ElfError:
                continue
            if info.soname == DRIVER_LIBRARY and ENCODERS[0] in info.defined and MARKER not in info.defined:
                return path, step
    return None, step


def _driver_files(directory: str) -> list[tuple[str, str]]:
    """(path, version) of each file in `directory` named like a driver: libcuda.so.<version>, and
    libcuda.so.1 (version "0"); none where the directory cannot be listed."""
    try:
        names = door.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        match = _DRIVER_FILE.match(name)
        if match or name == DRIVER_LIBRARY:
            found.append((os.path.join(directory, name), match.group(1) if match else "0"))
    return found


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))
