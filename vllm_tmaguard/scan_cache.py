"""The vLLM scan, cached across processes (every vLLM worker runs the guard): one JSON file per vLLM
install in the guard's private record directory, valid while vLLM's version file and extension files keep
their size and modification time."""

from __future__ import annotations

import hashlib
import json
import os

from .files import write_atomically
from .process import find_package_dir
from .vllm_probe import Extension, VllmFacts, extension_modules, probe_vllm

# 2: only the extensions this interpreter can load (vllm_probe.loadable_here); 3: kernels listed, absent files
_FORMAT = 3


def _signature(paths: list[str]) -> list[list[int] | None] | None:
    """Size and modification time of each file; None for one that is not there (a slim image drops
    extension files its wheel lists: their absence is part of what was scanned). None if one is unreadable."""
    signature: list[list[int] | None] = []
    for path in paths:
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            signature.append(None)
            continue
        except OSError:
            return None
        signature.append([stat.st_size, stat.st_mtime_ns])
    return signature


def _cache_path(cache_dir: str, package_dir: str) -> str:
    digest = hashlib.sha256(os.path.realpath(package_dir).encode()).hexdigest()[:16]
    return os.path.join(cache_dir, f"vllm-scan-{digest}.json")


def _watched(package_dir: str, extensions: list[str]) -> list[str]:
    return [os.path.join(package_dir, "_version.py"), *extensions]


def watched_files(package_dir: str) -> list[str]:
    """Every file the scan's validity rests on (its signature's), for the verdict cache."""
    return _watched(package_dir, [path for _, path in extension_modules(package_dir)])


def load(cache_dir: str, package_dir: str) -> VllmFacts | None:
    """The cached facts for this vLLM install, or None when absent, stale or unreadable."""
    try:
        with open(_cache_path(cache_dir, package_dir)) as file:
            cached = json.load(file)
        if cached.get("format") != _FORMAT or cached["package_dir"] != package_dir:
            return None
        paths = [e["path"] for e in cached["extensions"]] + cached["other_extensions"]
        if _signature(_watched(package_dir, paths)) != cached["signature"]:
            return None
        extensions = tuple(
            Extension(e["module"], e["path"], frozenset(e["driver_symbols"]), e["error"], e["absent"])
            for e in cached["extensions"]
        )
        return VllmFacts(
            True,
            cached["version"],
            package_dir,
            extensions,
            cached["platform_plugins"],
            tuple(cached["imported_at_platform_load"]),
            None if cached["kernels_listed"] is None else frozenset(cached["kernels_listed"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(cache_dir: str, facts: VllmFacts, all_extensions: list[str]) -> None:
    """Writes the facts atomically; a failure only costs the next process a rescan."""
    assert facts.package_dir is not None
    scanned = {e.path for e in facts.extensions}
    others = [p for p in all_extensions if p not in scanned]
    signature = _signature(_watched(facts.package_dir, [e.path for e in facts.extensions] + others))
    if signature is None:
        return
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
        "other_extensions": others,
        "platform_plugins": facts.platform_plugins,
        "imported_at_platform_load": list(facts.imported_at_platform_load),
        "kernels_listed": None if facts.kernels_listed is None else sorted(facts.kernels_listed),
    }
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        write_atomically(_cache_path(cache_dir, facts.package_dir), json.dumps(document).encode())
    except OSError:
        pass


def probe_vllm_cached(cache_dir: str | None, package_dir: str | None = None) -> VllmFacts:
    """probe_vllm, answered from the cache when this install was scanned before and is unchanged."""
    package_dir = package_dir or find_package_dir()
    if package_dir is None:
        return VllmFacts(found=False)
    if cache_dir and (cached := load(cache_dir, package_dir)) is not None:
        return cached
    facts = probe_vllm(package_dir)
    if cache_dir:
        store(cache_dir, facts, [path for _, path in extension_modules(package_dir)])
    return facts
