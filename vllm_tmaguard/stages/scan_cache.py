"""The vLLM scan, cached across processes (every vLLM worker runs the guard): one JSON file per vLLM
install in the guard's private record directory, valid while vLLM's version file and extension files are
unchanged (each one's stat as the verdict cache observes files: identity, size, modification and change
times). The scan's own reads are not verdict inputs: these files stand for them (door.not_noting)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from typing import Any

from .. import files
from ..process import find_package_dir
from . import door
from .vllm_probe import Extension, VllmFacts, extension_modules, probe_vllm

# 2: only the extensions this interpreter can load (vllm_probe.loadable_here); 3: kernels listed, absent
# files; 4: signatures are the verdict cache's stat observations (change time included)
_FORMAT = 4


def _signature(paths: list[str]) -> list[Any]:
    """Each file's stat observation (noted: the verdict rests on the scan, the scan on these)."""
    return [door.seen(path) for path in paths]


CACHE_PREFIX, CACHE_SUFFIX = "vllm-scan-", ".json"


def _cache_name(package_dir: str) -> str:
    digest = hashlib.sha256(files.realpath(package_dir).encode()).hexdigest()[:16]
    return f"{CACHE_PREFIX}{digest}{CACHE_SUFFIX}"


def _watched(package_dir: str, extensions: list[str]) -> list[str]:
    return [os.path.join(package_dir, "_version.py"), *extensions]


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _path(value: Any) -> bool:
    """A path as store() writes it: absolute, no NUL byte (no file could have it: stat raises ValueError)."""
    return isinstance(value, str) and os.path.isabs(value) and "\0" not in value


def _extension(data: Any) -> Extension | None:
    """One cached extension, or None where it is not as store() writes it."""
    if not isinstance(data, dict):
        return None
    module, path, symbols = data.get("module"), data.get("path"), data.get("driver_symbols")
    error, absent = data.get("error"), data.get("absent")
    if not (isinstance(module, str) and _path(path) and _strings(symbols)):
        return None
    if not (error is None or isinstance(error, str)) or not isinstance(absent, bool):
        return None
    return Extension(module, path, frozenset(symbols), error, absent)


def _facts(cached: Any, package_dir: str) -> VllmFacts | None:
    """The cached facts, or None where the document is not store()'s for this install and format."""
    if not isinstance(cached, dict) or cached.get("format") != _FORMAT:
        return None
    listed = cached.get("extensions")
    extensions = [_extension(e) for e in listed] if isinstance(listed, list) else [None]
    version, kernels = cached.get("version"), cached.get("kernels_listed")
    shaped = (
        cached.get("package_dir") == package_dir and None not in extensions
        and _strings(cached.get("other_extensions")) and all(map(_path, cached["other_extensions"]))
        and _strings(cached.get("imported_at_platform_load"))
        and isinstance(cached.get("platform_plugins"), bool) and isinstance(cached.get("signature"), list)
        and (version is None or isinstance(version, str)) and (kernels is None or _strings(kernels))
    )  # fmt: skip
    if not shaped:
        return None
    return VllmFacts(
        True,
        version,
        package_dir,
        tuple(e for e in extensions if e is not None),
        cached["platform_plugins"],
        tuple(cached["imported_at_platform_load"]),
        None if kernels is None else frozenset(kernels),
    )


def load(cache_dir: str, package_dir: str) -> VllmFacts | None:
    """The cached facts for this install, or None when absent, unsafe, damaged or stale (the caller scans
    again and replaces the file)."""
    try:
        cached = files.read_private_json(cache_dir, _cache_name(package_dir))
    except (OSError, ValueError):
        return None
    facts = _facts(cached, package_dir)
    if facts is None:
        return None
    paths = [e.path for e in facts.extensions] + cached["other_extensions"]
    return facts if _signature(_watched(package_dir, paths)) == cached["signature"] else None


def store(cache_dir: str, facts: VllmFacts, all_extensions: list[str], signature: list[Any]) -> None:
    """Writes the facts atomically with the signature they were scanned under; a failure only costs the next
    process a rescan."""
    assert facts.package_dir is not None
    scanned = {e.path for e in facts.extensions}
    document = {
        "format": _FORMAT,
        "package_dir": facts.package_dir,
        "version": facts.version,
        "signature": signature,
        "extensions": [
            {
                "module": e.module,
                "path": e.path,
                "driver_symbols": sorted(e.driver_symbols),
                "error": e.error,
                "absent": e.absent,
            }
            for e in facts.extensions
        ],
        "other_extensions": [p for p in all_extensions if p not in scanned],
        "platform_plugins": facts.platform_plugins,
        "imported_at_platform_load": list(facts.imported_at_platform_load),
        "kernels_listed": None if facts.kernels_listed is None else sorted(facts.kernels_listed),
    }
    with contextlib.suppress(OSError):
        door.write_private(cache_dir, _cache_name(facts.package_dir), json.dumps(document).encode())


def probe_vllm_cached(cache_dir: str | None, package_dir: str | None = None) -> VllmFacts:
    """probe_vllm, answered from the cache when this install was scanned before and is unchanged. A scan
    during which a watched file changed is not kept (and its notes show the change: door.Notes.steady)."""
    package_dir = package_dir or find_package_dir()
    if package_dir is None:
        return VllmFacts(found=False)
    if cache_dir and (cached := load(cache_dir, package_dir)) is not None:
        return cached
    with door.not_noting():
        all_extensions = [path for _, path in extension_modules(package_dir)]
    watched = _watched(package_dir, all_extensions)
    before = _signature(watched)
    with door.not_noting():
        facts = probe_vllm(package_dir)
    if cache_dir and _signature(watched) == before:
        store(cache_dir, facts, all_extensions, before)
    return facts
