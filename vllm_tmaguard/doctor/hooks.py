"""Whether the guard runs in vLLM processes started here (its platform-plugin entry point, VLLM_PLUGINS, its
.pth hook), the libraries it would load there, and the last record it wrote."""

from __future__ import annotations

import contextlib
import os
import site
import time
from collections.abc import Mapping
from typing import Any

from .. import __version__, files
from ..issue import LAST_RECORD
from ..stages import door
from ..stages.catalogue import PACKAGE_DIR, SHIM_FILES, overlay_path, shim_path
from ..stages.scan_cache import CACHE_PREFIX, CACHE_SUFFIX
from ..stages.store import record_dir_to_read
from ..stages.supply import Supply
from ..verdict import CACHE_FILE
from .record_shape import SCHEMA, why_not_a_record


def _library_file(supply: Supply) -> str | None:
    """The file the guard loads for one supply (a shim, or the overlay)."""
    if supply.library == "overlay":
        return overlay_path()
    return shim_path(supply.library) if supply.library in SHIM_FILES else None


def _site_dirs() -> set[str]:
    """The directories whose .pth files the interpreter runs at start-up."""
    dirs = set(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    return {os.path.realpath(d) for d in dirs}


def guard_hooks(
    vllm_found: bool, platform_plugins: bool, environ: Mapping[str, str], supplies: tuple[Supply, ...]
) -> dict[str, Any]:
    """Whether the guard runs in vLLM processes started here (its entry point, its .pth hook), and what it
    would load there."""
    site = os.path.realpath(os.path.dirname(PACKAGE_DIR))
    entry_point = None
    try:
        names = door.listdir(site)
        infos = [n for n in names if n.startswith("vllm_tmaguard-") and n.endswith(".dist-info")]
    except OSError:
        infos = []
    for info in infos:
        text = door.read_text(os.path.join(site, info, "entry_points.txt"), 1 << 20)
        if text is not None:
            entry_point = "[vllm.platform_plugins]" in text
    plugins_filter = environ.get("VLLM_PLUGINS")
    filtered = plugins_filter is not None and "tmaguard" not in [p.strip() for p in plugins_filter.split(",")]
    pth = site in _site_dirs() and os.path.exists(os.path.join(site, "vllm_tmaguard.pth"))
    plugin_runs = bool(entry_point) and platform_plugins and not filtered
    loads = []
    for supply in supplies:
        path = _library_file(supply)
        loads.append(
            {
                "library": supply.library,
                "symbols": list(supply.symbols),
                "fallback": list(supply.fallback),
                "file": path,
                "file_exists": path is not None and os.path.exists(path),
            }
        )
    return {
        "version": __version__,
        "package_dir": PACKAGE_DIR,
        "platform_plugin": entry_point,
        "vllm_plugins": plugins_filter,
        "platform_plugin_runs": plugin_runs,
        "import_hook": pth,
        "hooked": plugin_runs or pth or not vllm_found,
        "supplies": loads,
    }


def read_record(asked_dir: str) -> dict[str, Any]:
    """The guard's last record where the guard put it for TMAGUARD_RECORD_DIR=`asked_dir` (store.py), read
    through the door (no link followed, no blocking, bounded) and checked against the record's schema
    (record_shape.py): `error` says why a file there is not a record; a record of another schema is kept
    as its schema number alone."""
    where = record_dir_to_read(asked_dir)
    path = os.path.join(where.path, LAST_RECORD) if where.path else None
    out: dict[str, Any] = {
        "path": path, "asked": asked_dir, "refused": where.refused,
        "found": False, "age_s": None, "error": None, "record": None,
        "unusable_caches": unusable_caches(where.path),
    }  # fmt: skip
    if where.path is None or path is None:
        return out
    try:
        document = files.read_private_json(where.path, LAST_RECORD)
    except FileNotFoundError:
        return out
    except (OSError, ValueError) as error:
        out["error"] = str(error)
        return out
    schema = document.get("schema") if isinstance(document, dict) else None
    why = None if isinstance(schema, int) and schema != SCHEMA else why_not_a_record(document)
    if why is not None:
        out["error"] = f"{path} {why}"
        return out
    out.update(found=True, record=document if schema == SCHEMA else {"schema": schema})
    with contextlib.suppress(OSError):
        out["age_s"] = round(time.time() - os.lstat(path).st_mtime, 1)
    return out


def _a_cache(name: str) -> bool:
    return name == CACHE_FILE or (name.startswith(CACHE_PREFIX) and name.endswith(CACHE_SUFFIX))


def unusable_caches(directory: str | None) -> list[dict[str, str]]:
    """The guard's caches in its record directory (verdicts.json, the vLLM scans) that no vLLM process can
    read, each with why: not a regular file of this user's alone, or not a JSON object. The next full run
    replaces such a file where it can (a directory in its place it cannot); until then every vLLM process
    decides afresh. A cache of another version is no finding (it is replaced the same way, as intended)."""
    try:
        names = door.listdir(directory) if directory else []
    except OSError:
        return []
    unusable = []
    for name in filter(_a_cache, names):
        path = os.path.join(directory or "", name)
        try:
            document = files.read_private_json(directory or "", name)
        except (OSError, ValueError) as error:
            unusable.append({"path": path, "error": str(error)})
            continue
        if not isinstance(document, dict):
            shape = f"{path}: holds {type(document).__name__}, not a JSON object"
            unusable.append({"path": path, "error": shape})
    return unusable
