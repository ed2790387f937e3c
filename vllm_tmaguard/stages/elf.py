"""A small, bounds-checked reader for what the dynamic loader sees in an ELF file: SONAME, NEEDED entries,
dynamic symbols and (where asked) the symbol versions it needs. Reads only the section headers, .dynsym,
.dynstr, .dynamic and .gnu.version_r through mmap, so a 100 MB driver or extension costs a few page faults,
and it never runs any of the file's code. Also a library's identity (size, sha256, build ID, the .comment
section's version strings), for telling builds of a sharing layer apart across nodes."""

import hashlib
import mmap
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from .. import files
from . import door
from .values import value_type

EM_X86_64 = 62
EM_AARCH64 = 183
_SHT_DYNAMIC = 6
_SHT_DYNSYM = 11
_SHT_GNU_VERNEED = 0x6FFFFFFE
ELFCLASS32, ELFCLASS64 = 1, 2
_DT_NULL, _DT_NEEDED, _DT_SONAME = 0, 1, 14
_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10
_SHN_UNDEF = 0


# What an ElfError is about (ElfError.kind): the file could not be opened (errno says why), the door refused
# it (not a regular file), it is no ELF file at all (what the loader calls "file too short" or "invalid ELF
# header"), or an ELF file this reader cannot make sense of (the loader may still load it).
OPEN_FAILED, REFUSED, NOT_ELF, MALFORMED = "open-failed", "refused", "not-elf", "malformed"


class ElfError(ValueError):
    """The file is not an ELF shared object this reader can make sense of."""

    def __init__(self, path: str, why: str, errno: int | None = None, kind: str = MALFORMED) -> None:
        self.path, self.why, self.errno = path, why, errno  # errno: the OSError's, when opening failed
        self.kind = kind
        super().__init__(f"{path}: {why}")


@value_type
class ElfInfo:
    path: str
    machine: int
    soname: str | None
    needed: tuple[str, ...]
    defined: frozenset[str]  # global/weak symbols the file exports (filtered by the caller's prefixes)
    undefined: frozenset[str]  # strong undefined symbols: the loader fails if none of its scope has them
    elf_class: int = ELFCLASS64
    # (file, version) the loader must find, from .gnu.version_r ("libc.so.6", "GLIBC_2.34"); read only
    # where asked (read_elf's `versions`), else empty
    needs_versions: tuple[tuple[str, str], ...] = ()


@value_type
class _Layout:
    header: struct.Struct
    section: struct.Struct
    symbol: struct.Struct
    dyn: struct.Struct
    symbol_fields: tuple[int, int, int]  # indices of st_name, st_info, st_shndx in symbol


def _layout(elf_class: int, byte_order: str) -> _Layout:
    if elf_class == 2:
        return _Layout(
            struct.Struct(byte_order + "HHIQQQIHHHHHH"),
            struct.Struct(byte_order + "IIQQQQIIQQ"),
            struct.Struct(byte_order + "IBBHQQ"),
            struct.Struct(byte_order + "qQ"),
            (0, 1, 3),
        )
    return _Layout(
        struct.Struct(byte_order + "HHIIIIIHHHHHH"),
        struct.Struct(byte_order + "IIIIIIIIII"),
        struct.Struct(byte_order + "IIIBBH"),
        struct.Struct(byte_order + "iI"),
        (0, 3, 5),
    )


_MAX_NAME = 4096  # longer names (none the guard looks for) read as "": bounds the terminator scan


def _string_at(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset, offset + _MAX_NAME)
    if offset >= len(table) or end < 0:
        return ""
    return table[offset:end].decode("utf-8", "replace")


@contextmanager
def mapped(path: str) -> Iterator[tuple[mmap.mmap, int]]:
    """`path` mapped read-only, with its size. ElfError for a file that cannot be opened (with its errno) or
    is too short for an ELF header."""
    try:
        with door.mapped(path) as (image, size):
            if size < 64:
                raise ElfError(path, f"too short for an ELF header ({size} bytes)", kind=NOT_ELF)
            yield image, size
    except OSError as error:
        kind = REFUSED if isinstance(error, files.Refused) else OPEN_FAILED
        raise ElfError(path, error.strerror or str(error), error.errno, kind) from error


def read_elf(
    path: str, prefixes: tuple[bytes, ...] | None = None, symbols: bool = True, versions: bool = False
) -> ElfInfo:
    """Reads SONAME, NEEDED and the dynamic symbols whose names start with one of `prefixes` (all if None;
    none if not `symbols`); with `versions`, the symbol versions it needs.

    Raises ElfError for anything that is not a readable, well-formed ELF file; OSError passes through
    as ElfError too, so callers handle one exception type."""
    try:
        with mapped(path) as (image, size):
            return _parse(path, image, size, prefixes, symbols, versions)
    except (struct.error, IndexError, OverflowError, ValueError) as error:
        if isinstance(error, ElfError):
            raise
        raise ElfError(path, f"malformed ELF ({error})") from error


def _section_table(
    path: str, image: mmap.mmap | bytearray, size: int
) -> tuple[_Layout, int, list[tuple], int]:
    """The layout, machine, section headers and .shstrtab index of an ELF image (bounds-checked)."""
    if image[:4] != b"\x7fELF":
        raise ElfError(path, "not an ELF file (bad magic)", kind=NOT_ELF)
    elf_class, data = image[4], image[5]
    if elf_class not in (1, 2) or data not in (1, 2):
        raise ElfError(path, f"unknown ELF class/byte order ({elf_class}/{data})", kind=NOT_ELF)
    layout = _layout(elf_class, "<" if data == 1 else ">")
    fields = layout.header.unpack_from(image, 16)
    machine, shoff, shentsize, shnum, shstrndx = fields[1], fields[5], fields[10], fields[11], fields[12]
    if shoff == 0 or shentsize < layout.section.size:
        raise ElfError(path, "no usable section header table")
    if shnum == 0:  # extended numbering: the real count is in section 0's sh_size
        shnum = layout.section.unpack_from(image, shoff)[5]
    if shnum > 65536 or shoff + shnum * shentsize > size:
        raise ElfError(path, "section header table runs past the end of the file")
    sections = [layout.section.unpack_from(image, shoff + i * shentsize) for i in range(shnum)]
    return layout, machine, sections, shstrndx


def section_extent(path: str, image: mmap.mmap, size: int, name: str) -> tuple[int, int] | None:
    """(file offset, size) of the section called `name` in an mmap-ed ELF image, or None if it has none.

    Raises ElfError like read_elf for a malformed file, and when the section runs past the end."""
    try:
        _, _, sections, shstrndx = _section_table(path, image, size)
        if not 0 < shstrndx < len(sections):
            raise ElfError(path, "no section name table")
        names_at, names_size = sections[shstrndx][4], sections[shstrndx][5]
        if names_at + names_size > size:
            raise ElfError(path, "section name table runs past the end of the file")
        names = image[names_at : names_at + names_size]
        wanted = name.encode()
        for section in sections:
            if _string_at(names, section[0]).encode() == wanted:
                offset, length = section[4], section[5]
                if offset + length > size:
                    raise ElfError(path, f"section {name} runs past the end of the file")
                return offset, length
        return None
    except (struct.error, IndexError, OverflowError) as error:
        raise ElfError(path, f"malformed ELF ({error})") from error


def retag_dynamic(path: str, image: bytearray, old: int, new: int) -> int:
    """Rewrites in place the tag of every .dynamic entry tagged `old` to `new`; returns how many there were.
    Raises ElfError like read_elf."""
    try:
        layout, _, sections, _ = _section_table(path, image, len(image))
        count = 0
        for section in sections:
            if section[1] != _SHT_DYNAMIC:
                continue
            offset, length = section[4], section[5]
            if offset + length > len(image):
                raise ElfError(path, "the dynamic section runs past the end of the file")
            for at in range(offset, offset + length - layout.dyn.size + 1, layout.dyn.size):
                tag, value = layout.dyn.unpack_from(image, at)
                if tag == _DT_NULL:
                    break
                if tag == old:
                    layout.dyn.pack_into(image, at, new, value)
                    count += 1
        return count
    except (struct.error, IndexError, OverflowError) as error:
        raise ElfError(path, f"malformed ELF ({error})") from error


def _parse(
    path: str,
    image: mmap.mmap,
    size: int,
    prefixes: tuple[bytes, ...] | None,
    symbols: bool,
    versions: bool = False,
) -> ElfInfo:
    layout, machine, sections, _ = _section_table(path, image, size)

    def section_bytes(index: int) -> bytes:
        if not 0 <= index < len(sections):
            raise ElfError(path, f"section index {index} out of range")
        offset, length = sections[index][4], sections[index][5]
        if offset + length > size:
            raise ElfError(path, f"section {index} runs past the end of the file")
        return image[offset : offset + length]

    soname, needed = None, []
    defined, undefined = set(), set()
    needs: tuple[tuple[str, str], ...] = ()
    for index, section in enumerate(sections):
        kind, link, entsize = section[1], section[6], section[9]
        if kind == _SHT_GNU_VERNEED and versions and not needs:
            needs = _version_needs(section_bytes(index), section_bytes(link), "<" if image[5] == 1 else ">")
        elif kind == _SHT_DYNAMIC:
            strings = section_bytes(link)
            for tag, value in layout.dyn.iter_unpack(_whole(section_bytes(index), layout.dyn.size)):
                if tag == _DT_NULL:
                    break
                if tag == _DT_NEEDED:
                    needed.append(_string_at(strings, value))
                elif tag == _DT_SONAME:
                    soname = _string_at(strings, value)
        elif kind == _SHT_DYNSYM and symbols:
            if entsize != layout.symbol.size:
                raise ElfError(path, f"unexpected .dynsym entry size {entsize}")
            strings = section_bytes(link)
            name_at, info_at, shndx_at = layout.symbol_fields
            for symbol in layout.symbol.iter_unpack(_whole(section_bytes(index), entsize)):
                offset = symbol[name_at]
                if offset == 0 or (prefixes is not None and not strings.startswith(prefixes, offset)):
                    continue
                binding = symbol[info_at] >> 4
                if symbol[shndx_at] == _SHN_UNDEF:
                    if binding == _STB_GLOBAL:
                        undefined.add(_string_at(strings, offset))
                elif binding in (_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE):
                    defined.add(_string_at(strings, offset))
    return ElfInfo(
        path, machine, soname, tuple(needed), frozenset(defined), frozenset(undefined), image[4], needs
    )


_MAX_VERSIONS = 1024  # versions needed, over all files: glibc's own libraries define ~40 each


def _version_needs(table: bytes, strings: bytes, byte_order: str) -> tuple[tuple[str, str], ...]:
    """(file, version) pairs of a .gnu.version_r section: a chain of Verneed entries (vn_version, vn_cnt,
    vn_file, vn_aux, vn_next), each with vn_cnt Vernaux entries (vna_hash, vna_flags, vna_other, vna_name,
    vna_next), 16 bytes each in both classes. Offsets are unsigned and relative, so each walk only moves
    forward, within the section, at most _MAX_VERSIONS steps in all."""
    verneed, vernaux = struct.Struct(byte_order + "HHIII"), struct.Struct(byte_order + "IHHII")
    found: list[tuple[str, str]] = []
    at, steps = 0, 0
    while at + verneed.size <= len(table) and steps < _MAX_VERSIONS:
        _, count, file_at, aux, following = verneed.unpack_from(table, at)
        steps += 1
        aux_at = at + aux
        for _ in range(min(count, _MAX_VERSIONS - len(found))):
            if aux_at + vernaux.size > len(table):
                break
            _, _, _, name_at, aux_next = vernaux.unpack_from(table, aux_at)
            found.append((_string_at(strings, file_at), _string_at(strings, name_at)))
            if aux_next == 0:
                break
            aux_at += aux_next
        if following == 0 or len(found) >= _MAX_VERSIONS:
            break
        at += following
    return tuple(found)


def _whole(table: bytes, entry_size: int) -> bytes:
    """The table cut to a whole number of entries (a truncated last entry is ignored, not a crash)."""
    return table[: len(table) - len(table) % entry_size]


def native_machine() -> int | None:
    return {"x86_64": EM_X86_64, "aarch64": EM_AARCH64}.get(os.uname().machine)


# Machines a layer's library may have been built for, by e_machine, in the words `file` uses.
MACHINES = {3: "Intel 80386", 8: "MIPS", 20: "PowerPC", 21: "64-bit PowerPC", 22: "IBM S/390", 40: "ARM",
            EM_X86_64: "x86-64", EM_AARCH64: "ARM aarch64", 243: "RISC-V"}  # fmt: skip


@value_type
class Identity:
    """Which build a library file is: what tells two nodes' copies of a layer apart."""

    size: int
    sha256: str | None  # hex digest of the whole file; None past the caller's limit
    build_id: str | None  # the linker's NT_GNU_BUILD_ID, hex (survives stripping)
    versions: tuple[str, ...]  # the .comment section's strings: the compiler and linker versions


_NT_GNU_BUILD_ID = 3
_COMMENT_LIMIT, _COMMENTS, _COMMENT_CHARS = 4096, 4, 100


def read_identity(path: str, hash_limit: int) -> Identity:
    """The file's size, its sha256 (where no larger than `hash_limit`), its build ID and .comment strings.
    Raises ElfError where it cannot be mapped (too short for an ELF header); a damaged section table leaves
    the build ID and versions empty."""
    with mapped(path) as (image, size):
        digest = hashlib.sha256(image).hexdigest() if size <= hash_limit else None
        try:
            note = section_extent(path, image, size, ".note.gnu.build-id")
            comment = section_extent(path, image, size, ".comment")
        except ElfError:
            note = comment = None
        build_id = _build_id(image[note[0] : note[0] + min(note[1], 256)], image[5]) if note else None
        text = image[comment[0] : comment[0] + min(comment[1], _COMMENT_LIMIT)] if comment else b""
        return Identity(size, digest, build_id, _printable_strings(text))


def _build_id(note: bytes, data: int) -> str | None:
    if len(note) < 12:
        return None
    namesz, descsz, kind = struct.unpack_from("<III" if data == 1 else ">III", note)
    start = 12 + (namesz + 3) // 4 * 4
    if kind != _NT_GNU_BUILD_ID or not 0 < descsz <= 64 or start + descsz > len(note):
        return None
    return note[start : start + descsz].hex()


def _printable_strings(data: bytes) -> tuple[str, ...]:
    found: list[str] = []
    for raw in data.split(b"\0"):
        text = "".join(c for c in raw.decode("ascii", "replace") if " " <= c <= "~").strip()
        if text and text not in found:
            found.append(text[:_COMMENT_CHARS])
        if len(found) == _COMMENTS:
            break
    return tuple(found)
