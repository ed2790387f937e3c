"""Whether a preloaded sharing layer is in force (docs/design.md §2.10), and which build a layer's library is.

The loader skips a preload entry it cannot map, printing `ERROR: ld.so: object '...' from LD_PRELOAD (or
/etc/ld.so.preload) cannot be preloaded (...): ignored.`, and the process runs on without it: on NVIDIA's
driver, with no quota (measured on glibc 2.36: a missing file, a directory, a file that is no ELF, another
ELF class, another machine). An entry needing a glibc symbol version this glibc lacks stops every process
instead (`version `GLIBC_x.y' not found`). Inside a process the loader's own list decides: an entry it read
and did not map is not in force, whatever its file looks like. A preload file under another root
(TMAGUARD_ROOT) is not this process's loader's: its entries are judged by their files alone. Passive: files
read through the door, the loader's list asked (loaded.read_loaded_objects), nothing loaded."""

import errno
import os
import sys
from collections.abc import Mapping

from .. import files
from ..loaded import mapped_files, read_loaded_objects
from .elf import (
    ELFCLASS32,
    ELFCLASS64,
    MACHINES,
    NOT_ELF,
    OPEN_FAILED,
    REFUSED,
    ElfError,
    ElfInfo,
    native_machine,
    read_elf,
    read_identity,
)
from .values import value_type

# Why a preload entry of a judged layer is not in force (PreloadFault.kind), with what the loader prints.
MISSING, UNREADABLE, NOT_A_FILE, NOT_AN_ELF = "missing", "unreadable", "not-a-file", "not-elf"
WRONG_CLASS, WRONG_MACHINE, NEEDS_NEWER_GLIBC = "wrong-class", "wrong-machine", "needs-newer-glibc"
NOT_LOADED = "not-loaded"  # the file looks loadable, but this process's loader has not mapped it
LOADER_SAYS = {
    MISSING: "cannot open shared object file", UNREADABLE: "cannot open shared object file",
    NOT_A_FILE: "cannot read file data", NOT_AN_ELF: "file too short / invalid ELF header",
    WRONG_CLASS: "wrong ELF class", WRONG_MACHINE: "cannot open shared object file",
}  # fmt: skip
PRELOAD_ENV, PRELOAD_FILE = "LD_PRELOAD", "/etc/ld.so.preload"
# A layer's conditions (layers.Layer.conditions; metering.layer_problems says what each breaks).
NOT_IN_FORCE = "preload-not-in-force"  # the loader skips every preload entry of the layer
PRELOAD_NEEDS_GLIBC = "preload-needs-newer-glibc"  # an entry needs a glibc version this glibc lacks
NOT_PRELOADED = "limits-without-preload"  # HAMi's limits and its mounted library, and nothing preloads it
CONTROL_DISABLED = "control-disabled"  # beside NOT_PRELOADED: HAMi's CUDA_DISABLE_CONTROL parses true
# HAMi-core as HAMi's device plugin (and KAI's isolator) mounts it; HAMi's plugin leaves /etc/ld.so.preload
# out of a container whose CUDA_DISABLE_CONTROL parses true (Go's strconv.ParseBool), and sets the limits
# anyway (Project-HAMi/HAMi 4707fb0 pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go).
HAMI_LIBRARY = "/usr/local/vgpu/libvgpu.so"
HAMI_SWITCH = "CUDA_DISABLE_CONTROL"
_GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
LIBRARY_HASH_LIMIT = 64 << 20  # a layer's library is a few MB; past this its size alone is recorded


@value_type
class PreloadFault:
    entry: str  # as LD_PRELOAD or /etc/ld.so.preload names it
    source: str  # PRELOAD_ENV or PRELOAD_FILE
    kind: str  # one of MISSING ... NOT_LOADED
    found: str  # what was found, in words ("is a directory, not a regular file", "ELFCLASS32", ...)
    needs: str | None = None  # NEEDS_NEWER_GLIBC: the version it needs ("GLIBC_2.99")


@value_type
class Library:
    """A layer's library file and which build it is (elf.read_identity): what tells nodes' copies apart."""

    path: str
    size: int | None = None
    sha256: str | None = None  # the first 12 hex digits
    build_id: str | None = None
    versions: tuple[str, ...] = ()  # the .comment strings: the compiler and linker that built it
    error: str | None = None  # why it could not be read


def in_force(
    entries: list[str], faults: Mapping[str, PreloadFault]
) -> tuple[tuple[str, ...], tuple[PreloadFault, ...]]:
    """(conditions, faults) of a preloaded layer's entries: not in force where the loader skips every one;
    one needing a newer glibc stops every process whatever the others."""
    found = tuple(fault for entry in entries if (fault := faults.get(entry)) is not None)
    if any(fault.kind == NEEDS_NEWER_GLIBC for fault in found):
        return (PRELOAD_NEEDS_GLIBC,), found
    if found and len(found) == len(entries):
        return (NOT_IN_FORCE,), found
    return (), ()


def not_preloaded(limits: bool, mounted: bool, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The conditions of HAMi's limits set with nothing preloading HAMi-core: beside its mounted library, or
    with its device plugin's switch (which leaves the preload out); () where neither."""
    switched_off = environ.get(HAMI_SWITCH, "").strip() in _GO_TRUE
    if not limits or not (mounted or switched_off):
        return ()
    return (NOT_PRELOADED, CONTROL_DISABLED) if switched_off else (NOT_PRELOADED,)


def split_preload(value: str) -> list[str]:
    """LD_PRELOAD's entries, as the loader splits them (by colons and white space)."""
    return value.replace(":", " ").split()


def preload_file_entries(text: str) -> list[str]:
    """/etc/ld.so.preload's entries: white-space separated, a # starting a comment."""
    return [word for line in text.splitlines() for word in line.split("#", 1)[0].split()]


def read_preload(path: str, prefixes: tuple[bytes, ...]) -> ElfInfo | ElfError:
    """A preloaded file's ELF (with the symbol versions it needs), or why it could not be read."""
    try:
        return read_elf(path, prefixes=prefixes, versions=True)
    except ElfError as error:
        return error


def faults_of(
    entries: list[str],
    from_env: list[str],
    paths: Mapping[str, str],
    read: Mapping[str, ElfInfo | ElfError],
    own_preload_file: bool,
) -> dict[str, PreloadFault]:
    """Which of `entries` (the preloaded layers' LD_PRELOAD and /etc/ld.so.preload entries) are not in force,
    and why. This process's loader read LD_PRELOAD (`from_env`), and the preload file where it is the real
    root's (`own_preload_file`): those entries are asked of its own list."""
    if not entries:
        return {}
    loaded = _loaded_names()
    faults = {}
    for entry in entries:
        source = PRELOAD_ENV if entry in from_env else PRELOAD_FILE
        mapped = None
        if loaded is not None and (source == PRELOAD_ENV or own_preload_file):
            mapped = _is_mapped(entry, paths.get(entry), loaded)
        fault = judge_preload(entry, source, read.get(entry), mapped, native_machine(), glibc_version())
        if fault is not None:
            faults[entry] = fault
    return faults


def _loaded_names() -> frozenset[str] | None:
    """The paths and file names of the objects this process's loader has mapped (None: it cannot be asked)."""
    text = read_loaded_objects()
    if text is None:
        return None
    paths = mapped_files(text)
    return frozenset(paths) | {os.path.basename(path) for path in paths}


def _is_mapped(entry: str, path: str | None, loaded: frozenset[str]) -> bool:
    """Whether the loader mapped `entry`: by the name it was given, the file's name (an entry without a
    slash is searched for), or, where /proc/self/maps answered (the kernel's names), the file it names."""
    if entry in loaded or os.path.basename(entry) in loaded:
        return True
    return path is not None and os.path.isabs(path) and files.realpath(path) in loaded


def glibc_version() -> tuple[int, ...] | None:
    """This process's glibc (the pod's own where the guard or the doctor runs in the pod's image)."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    return _version_tuple(text.removeprefix("glibc ").strip())


def _version_tuple(text: str) -> tuple[int, ...] | None:
    parts = text.split(".")
    return tuple(int(p) for p in parts) if parts and all(p.isdigit() and len(p) < 6 for p in parts) else None


def judge_preload(
    entry: str,
    source: str,
    read: ElfInfo | ElfError | None,
    mapped: bool | None,
    machine: int | None,
    glibc: tuple[int, ...] | None,
) -> PreloadFault | None:
    """Why `entry` is not in force, or None. `read`: its ELF or why it could not be read (None: not read, a
    relative entry); `mapped`: whether this process's loader mapped it (None: not this loader's entry, or
    not asked); `machine`: this process's e_machine; `glibc`: this glibc's version. Mapped is in force,
    whatever the file looks like; a file the reader cannot make sense of, but the loader may load, is not
    judged."""
    if mapped:
        return None
    fault = _file_fault(read, machine, glibc)
    if fault is not None:
        return PreloadFault(entry, source, *fault)
    if mapped is False:
        return PreloadFault(entry, source, NOT_LOADED, "not among the objects this process's loader mapped")
    return None


def _file_fault(
    read: ElfInfo | ElfError | None, machine: int | None, glibc: tuple[int, ...] | None
) -> tuple[str, str] | tuple[str, str, str] | None:
    """(kind, what was found[, the version needed]) where the loader cannot load the file; None where it
    can, or where the reader cannot tell."""
    if isinstance(read, ElfError):
        if read.kind == OPEN_FAILED and read.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return MISSING, read.why
        if read.kind == OPEN_FAILED and read.errno in (errno.EACCES, errno.EPERM):
            return UNREADABLE, read.why
        if read.kind == REFUSED:
            return NOT_A_FILE, read.why
        return (NOT_AN_ELF, read.why) if read.kind == NOT_ELF else None
    if read is None:
        return None
    own_class = ELFCLASS64 if sys.maxsize > 2**32 else ELFCLASS32
    if read.elf_class != own_class:
        return WRONG_CLASS, f"ELFCLASS{32 if read.elf_class == ELFCLASS32 else 64}"
    if machine is not None and read.machine != machine:
        return WRONG_MACHINE, f"built for {MACHINES.get(read.machine, f'machine {read.machine}')}"
    newest = max(
        ((v, name) for _, name in read.needs_versions if name.startswith("GLIBC_") and
         (v := _version_tuple(name.removeprefix("GLIBC_"))) is not None),
        default=None,
    )  # fmt: skip
    if glibc is not None and newest is not None and newest[0] > glibc:
        return NEEDS_NEWER_GLIBC, f"{newest[1]}, newer than this glibc {'.'.join(map(str, glibc))}", newest[1]
    return None


def library_of(path: str) -> Library:
    """The file's identity (elf.read_identity), read through the door: a verdict input where the fingerprints
    read it already."""
    try:
        found = read_identity(path, LIBRARY_HASH_LIMIT)
    except ElfError as error:
        return Library(path, error=error.why)
    digest = found.sha256[:12] if found.sha256 else None
    return Library(path, found.size, digest, found.build_id, found.versions)
