"""The installed vLLM, read from its files without importing it: version, extension modules and the
CUDA driver entry points each one needs from libcuda.so.1."""

import errno
import functools
import importlib.machinery
import os
import re

from ..process import find_package_dir
from . import door
from .catalogue import DRIVER_LIBRARY
from .elf import ElfError, read_elf
from .routing_table import table_for
from .values import value_type

_VERSION = re.compile(r"""^(?:__version__|version)\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)
_PLUGINS_GROUP = ("PLATFORM_PLUGINS_GROUP", "'vllm.platform_plugins'")  # 0.11+ constant; 0.8 - 0.10 literal
_MODULE_IMPORT = re.compile(r"^import (vllm\._C\w*)", re.M)
# CUDA driver API names: cu + an upper-case letter (cuda* is the runtime, cufft*/cublas* other libraries).
_DRIVER_SYMBOL = re.compile(r"cu[A-Z]")
# An extension built for one interpreter ABI (_C.cpython-312-x86_64-linux-gnu.so); abi3 and plain .so are not.
_ABI_TAGGED = re.compile(r"\.(?:cpython|pypy)[^./]*\.so$")
_OWN_ABI_SUFFIXES = tuple(s for s in importlib.machinery.EXTENSION_SUFFIXES if _ABI_TAGGED.search(s))


@value_type
class Extension:
    module: str  # e.g. "vllm._C_stable_libtorch"
    path: str
    driver_symbols: frozenset[str]  # strong undefined cu* symbols, resolved from libcuda.so.1
    error: str | None = None  # the file could not be read
    absent: bool = False  # the file is not there (the wheel lists it, the image lacks it)


@value_type
class VllmFacts:
    found: bool
    version: str | None = None
    package_dir: str | None = None
    extensions: tuple[Extension, ...] = ()
    platform_plugins: bool = False  # has the vllm.platform_plugins entry-point group
    imported_at_platform_load: tuple[str, ...] = ()  # extensions platforms/cuda.py imports at module level
    kernels_listed: frozenset[str] | None = None  # the routing table's kernel names this vLLM's sources list

    def needs(self) -> dict[str, tuple[str, ...]]:
        """Each driver symbol the extensions need, with the modules that need it."""
        users: dict[str, list[str]] = {}
        for extension in self.extensions:
            for symbol in extension.driver_symbols:
                users.setdefault(symbol, []).append(extension.module)
        return {symbol: tuple(sorted(modules)) for symbol, modules in sorted(users.items())}


def _read_text(path: str) -> str | None:
    return door.read_text(path)


def _dist_info_record(package_dir: str, version: str | None) -> str | None:
    site = os.path.dirname(package_dir)
    if version:
        record = _read_text(os.path.join(site, f"vllm-{version}.dist-info", "RECORD"))
        if record is not None:
            return record
    try:
        names = [n for n in door.listdir(site) if n.startswith("vllm-") and n.endswith(".dist-info")]
    except OSError:
        return None
    return _read_text(os.path.join(site, names[0], "RECORD")) if len(names) == 1 else None


def loadable_here(path: str) -> bool:
    """Whether this interpreter would import the file: not an extension built for another Python's ABI
    (packages such as DeepGEMM ship one `_C.cpython-3XY-*.so` per CPython version)."""
    name = os.path.basename(path)
    return not _ABI_TAGGED.search(name) or name.endswith(_OWN_ABI_SUFFIXES)


@functools.lru_cache(maxsize=8)
def _extension_files(package_dir: str, version: str | None) -> tuple[str, ...]:
    """Every *.so under the package this interpreter could load: from the wheel's RECORD (cheap), else by
    walking the tree. Cached: the doctor asks twice (the guard's probe and the fat-binary scan)."""
    site = os.path.dirname(package_dir)
    record = _dist_info_record(package_dir, version)
    if record is not None:
        found = [os.path.join(site, f) for f in record_extensions(record)]
    else:
        found = []
        for directory, _, names in os.walk(package_dir):
            found.extend(os.path.join(directory, n) for n in names if n.endswith(".so"))
    return tuple(sorted(path for path in found if loadable_here(path)))


def record_extensions(record: str) -> list[str]:
    """The vllm/...so paths a wheel's RECORD lists (`path,hash,size` lines). Found from each ".so," alone:
    vLLM's RECORD has thousands of lines (700 KB), where a regular expression over every line costs a pod's
    first process milliseconds and a substring search microseconds."""
    found, start = [], 0
    while (end := record.find(".so,", start)) != -1:
        path = record[record.rfind("\n", 0, end) + 1 : end + 3]
        if path.startswith("vllm/") and "," not in path:
            found.append(path)
        start = end + 4
    return found


def _module_name(package_dir: str, path: str) -> str:
    relative = os.path.relpath(path, os.path.dirname(package_dir))
    return relative.split(".", 1)[0].replace(os.sep, ".")


def package_version(package_dir: str) -> str | None:
    """The version in the package's _version.py (vLLM's setuptools-scm file), without importing it."""
    match = _VERSION.search(_read_text(os.path.join(package_dir, "_version.py")) or "")
    return match.group(1) if match else None


def extension_modules(package_dir: str) -> list[tuple[str, str]]:
    """(module, path) of every extension module in the package, whether or not it links libcuda.so.1."""
    paths = _extension_files(package_dir, package_version(package_dir))
    return [(_module_name(package_dir, path), path) for path in paths]


def scan_extension(package_dir: str, path: str) -> Extension | None:
    """The extension's driver needs; None when it does not link libcuda.so.1 (nothing to resolve there)."""
    module = _module_name(package_dir, path)
    try:
        info = read_elf(path, prefixes=(b"cu",))
    except ElfError as error:
        return Extension(module, path, frozenset(), error.why, error.errno == errno.ENOENT)
    if DRIVER_LIBRARY not in info.needed:
        return None
    symbols = frozenset(s for s in info.undefined if _DRIVER_SYMBOL.match(s))
    return Extension(module, path, symbols)


def names_listed(
    package_dir: str, relatives: tuple[str, ...], names: tuple[str, ...]
) -> frozenset[str] | None:
    """Which of `names` appear in the package's source files `relatives`; None if one is unreadable."""
    texts = [_read_text(os.path.join(package_dir, relative)) for relative in relatives]
    if None in texts:
        return None
    return frozenset(n for n in names if any(_word_in(n, text) for text in texts))


def _word_in(word: str, text: str) -> bool:
    """Whether `word` appears in `text` as a whole word (re's \\b{word}\\b): a pattern compiled per kernel
    name would cost a pod's first process a millisecond."""
    start = 0
    while (at := text.find(word, start)) != -1:
        end = at + len(word)
        before = text[at - 1] if at else " "
        after = text[end] if end < len(text) else " "
        if not (before.isalnum() or before == "_" or after.isalnum() or after == "_"):
            return True
        start = at + 1
    return False


def probe_vllm(package_dir: str | None = None) -> VllmFacts:
    package_dir = package_dir or find_package_dir()
    if package_dir is None:
        return VllmFacts(found=False)
    version = package_version(package_dir)
    extensions = tuple(
        e for path in _extension_files(package_dir, version) if (e := scan_extension(package_dir, path))
    )
    # The group's loader: plugins/__init__.py from 0.11, platforms/__init__.py in 0.8 - 0.10.
    plugins_text = "".join(
        _read_text(os.path.join(package_dir, sub, "__init__.py")) or "" for sub in ("plugins", "platforms")
    )
    cuda_text = _read_text(os.path.join(package_dir, "platforms", "cuda.py")) or ""
    return VllmFacts(
        found=True,
        version=version,
        package_dir=package_dir,
        extensions=extensions,
        platform_plugins=any(name in plugins_text for name in _PLUGINS_GROUP),
        imported_at_platform_load=tuple(dict.fromkeys(_MODULE_IMPORT.findall(cuda_text))),
        kernels_listed=_kernels_listed(package_dir, version),
    )


def _kernels_listed(package_dir: str, version: str | None) -> frozenset[str] | None:
    table, _ = table_for(version)
    return names_listed(package_dir, table.listed_in, table.kernels)
