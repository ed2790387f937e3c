"""Which GPU architectures an extension module carries code for: reads the entry headers of the fat binaries
in its `.nv_fatbin` section (SASS cubins and PTX), skipping every payload, through mmap. A 300 MB extension
costs a few hundred page faults; nothing is decompressed and no CUDA library is loaded.

Layout (CUDA's fatbinary.h, and checked against `cuobjdump --list-elf --list-ptx` in tests/test_fatbin.py):
the section holds one or more containers, each a 16-byte header (magic 0xBA55ED50, u16 version, u16 header
size, u64 size of the entries that follow); each entry starts with u16 kind (1 PTX, 2 ELF cubin), u16
version, u32 header size, u64 payload size, ..., u32 arch (major * 10 + minor) at 28, u64 flags at 40.
Flag 0x100000 marks an arch-specific build (sm_90a: runs on 9.0 only), 0x200000 a family-specific one
(sm_100f: runs on 10.x from 10.0 up)."""

import mmap
import struct
from typing import NamedTuple

from ..stages.elf import ElfError, mapped, section_extent

SECTION = ".nv_fatbin"
MAGIC = 0xBA55ED50
KIND_PTX, KIND_CUBIN = 1, 2
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY_SPECIFIC = 0x200000
FLAG_COMPRESSED = 0x2000 | 0x8000  # older and newer compression flags
_CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
_ENTRY = struct.Struct("<HHIQ")  # kind, version, header size, payload size
_ARCH = struct.Struct("<I")
_FLAGS = struct.Struct("<Q")
_MIN_ENTRY_HEADER = 48  # up to and including the flags


class FatbinError(ElfError):
    """The file, its ELF section table or its fat binary cannot be read."""


class Entry(NamedTuple):
    kind: str  # "sass" (an ELF cubin) or "ptx"
    arch: int  # major * 10 + minor: 90, 100, 120
    variant: str  # "", "a" (arch-specific) or "f" (family-specific)
    container: int  # index of the fat binary (one per compiled translation unit) that holds it
    compressed: bool = False

    @property
    def name(self) -> str:
        return f"{'sm' if self.kind == 'sass' else 'compute'}_{self.arch}{self.variant}"

    def runs_on(self, capability: tuple[int, int]) -> str | None:
        """ "native" (SASS the device runs), "jit" (PTX the driver can compile for it) or None."""
        major, minor = divmod(self.arch, 10)
        device_major, device_minor = capability
        if self.variant == "a":
            fits = (major, minor) == capability
        elif self.variant == "f" or self.kind == "sass":
            fits = major == device_major and minor <= device_minor  # same major, not newer than the device
        else:
            fits = (major, minor) <= capability  # plain PTX: any device at least as new
        if not fits:
            return None
        return "native" if self.kind == "sass" else "jit"


class Fatbin(NamedTuple):
    path: str
    entries: tuple[Entry, ...]
    containers: int
    present: bool = True  # False: the file has no .nv_fatbin section (no device code)

    def names(self, kind: str) -> tuple[str, ...]:
        """Distinct architecture names of one kind ("sass", "ptx"), oldest first."""
        picked = {(e.arch, e.variant, e.name) for e in self.entries if e.kind == kind}
        return tuple(name for _, _, name in sorted(picked))

    def arch_specific_only(self) -> bool:
        """Every entry is an sm_XYa / sm_XYf build: a kernel library for named GPUs only."""
        return bool(self.entries) and all(e.variant for e in self.entries)


class Coverage(NamedTuple):
    capability: tuple[int, int]
    native: int  # fat binaries with SASS the device runs
    jit: int  # fat binaries the device can run only by JIT-compiling their PTX
    none: int  # fat binaries with no code the device can run
    containers: int
    missing_names: tuple[str, ...] = ()  # what the fat binaries without code for the device carry

    @property
    def verdict(self) -> str:
        """ "native" (every fat binary has SASS for the device), "partial" (some have, the others only PTX
        or nothing), "jit" (none has SASS, some PTX), "none" (no code for it), "no-code" (no fat binary)."""
        if self.containers == 0:
            return "no-code"
        if self.native == 0:
            return "jit" if self.jit else "none"
        return "native" if self.native == self.containers else "partial"


def sm_name(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


def coverage(fatbin: Fatbin, capability: tuple[int, int]) -> Coverage:
    """How many of the extension's fat binaries (translation units) have code the device can run."""
    best: dict[int, str | None] = {index: None for index in range(fatbin.containers)}
    carried: dict[int, set[str]] = {index: set() for index in range(fatbin.containers)}
    for entry in fatbin.entries:
        carried[entry.container].add(entry.name)
        verdict = entry.runs_on(capability)
        if verdict == "native" or (verdict == "jit" and best[entry.container] is None):
            best[entry.container] = verdict
    counts = {"native": 0, "jit": 0, None: 0}
    missing: set[str] = set()
    for index, verdict in best.items():
        counts[verdict] += 1
        if verdict is None:
            missing |= carried[index]
    return Coverage(
        capability,
        counts["native"],
        counts["jit"],
        counts[None],
        fatbin.containers,
        tuple(sorted(missing, key=lambda n: (int("".join(c for c in n if c.isdigit())), n))),
    )


def parse_fatbin(data: bytes | mmap.mmap, start: int, end: int, path: str = "<fatbin>") -> tuple[list, int]:
    """(entries, number of containers) of the fat binaries in data[start:end]. Reads headers only."""
    entries: list[Entry] = []
    containers = 0
    position = start
    while position + _CONTAINER.size <= end:
        magic, _, header_size, size = _CONTAINER.unpack_from(data, position)
        if magic != MAGIC:
            if magic == 0 and position % 8 == 0:  # zero padding between containers
                position += 8
                continue
            raise FatbinError(
                path, f"bad fat binary magic {magic:#x} at section offset {position - start:#x}"
            )
        if header_size < _CONTAINER.size or position + header_size + size > end:
            raise FatbinError(
                path, f"fat binary at section offset {position - start:#x} runs past the section"
            )
        at, stop = position + header_size, position + header_size + size
        while at < stop:
            if at + _MIN_ENTRY_HEADER > stop:
                raise FatbinError(path, f"truncated fat binary entry at section offset {at - start:#x}")
            kind, _, entry_header, payload = _ENTRY.unpack_from(data, at)
            if kind not in (KIND_PTX, KIND_CUBIN) or entry_header < _MIN_ENTRY_HEADER:
                raise FatbinError(
                    path, f"unknown fat binary entry (kind {kind}) at section offset {at - start:#x}"
                )
            if at + entry_header + payload > stop:
                raise FatbinError(
                    path, f"fat binary entry at section offset {at - start:#x} runs past its end"
                )
            (arch,) = _ARCH.unpack_from(data, at + 28)
            (flags,) = _FLAGS.unpack_from(data, at + 40)
            variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY_SPECIFIC else ""
            entries.append(
                Entry(
                    "sass" if kind == KIND_CUBIN else "ptx",
                    arch,
                    variant,
                    containers,
                    bool(flags & FLAG_COMPRESSED),
                )
            )
            at += entry_header + payload
        containers += 1
        position = stop
    return entries, containers


def read_fatbin(path: str) -> Fatbin:
    """The fat binary entries of an ELF file's .nv_fatbin section; Fatbin(present=False) if it has none.

    Raises FatbinError for an unreadable file, a malformed ELF, or a malformed fat binary."""
    try:
        with mapped(path) as (image, size):
            extent = section_extent(path, image, size, SECTION)
            if extent is None:
                return Fatbin(path, (), 0, present=False)
            offset, length = extent
            entries, containers = parse_fatbin(image, offset, offset + length, path)
            return Fatbin(path, tuple(entries), containers)
    except FatbinError:
        raise
    except ElfError as error:
        raise FatbinError(path, error.why, error.errno) from error
    except (struct.error, IndexError, OverflowError) as error:
        raise FatbinError(path, f"malformed fat binary ({error})") from error
