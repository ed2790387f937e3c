"""Whether the guard runs in vLLM processes started here (its platform-plugin entry point, VLLM_PLUGINS, its
.pth hook), the libraries it would load there, and the last record it wrote."""

from __future__ import annotations

import json
import os
import site
import time
from collections.abc import Mapping
from typing import Any

from .. import __version__
from ..catalogue import SHIM_FILES, overlay_path, shim_path
from ..store import record_dir_to_read
from ..supply import Supply


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
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    site = os.path.realpath(os.path.dirname(package_dir))
    entry_point = None
    try:
        infos = [n for n in os.listdir(site) if n.startswith("vllm_tmaguard-") and n.endswith(".dist-info")]
    except OSError:
        infos = []
    for info in infos:
        try:
            with open(os.path.join(site, info, "entry_points.txt")) as file:
                entry_point = "[vllm.platform_plugins]" in file.read()
        except OSError:
            continue
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
        "package_dir": package_dir,
        "platform_plugin": entry_point,
        "vllm_plugins": plugins_filter,
        "platform_plugin_runs": plugin_runs,
        "import_hook": pth,
        "hooked": plugin_runs or pth or not vllm_found,
        "supplies": loads,
    }


def read_record(asked_dir: str) -> dict[str, Any]:
    """The guard's last record where the guard put it for TMAGUARD_RECORD_DIR=`asked_dir` (store.py)."""
    where = record_dir_to_read(asked_dir)
    path = os.path.join(where.path or asked_dir, "last.json")
    out: dict[str, Any] = {
        "path": path, "asked": asked_dir, "refused": where.refused,
        "found": False, "age_s": None, "error": None, "record": None,
    }  # fmt: skip
    try:
        with open(path) as file:
            out["record"] = json.load(file)
        out["found"] = True
        out["age_s"] = round(time.time() - os.stat(path).st_mtime, 1)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as error:
        out["error"] = f"{type(error).__name__}: {error}"
    return out
