"""The doctor's report: what the guard's stages find and plan here (preview.py: the same answers a vLLM
process started here would get), asked passively (the GPUs from /proc/driver/nvidia, never NVML), plus what
only the doctor asks (hooks.py, binaries.py; with --active, NVML and CUDA in child processes). Never raises
for what it finds: an unreadable file or a hanging child is a finding (findings/)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from .. import __version__
from ..process import find_package_dir
from ..stages.toggles import Toggles
from .binaries import architectures, consumer_rows, overlay_exports, read_fatbins
from .children import DEFAULT_ACTIVE_TIMEOUT, DEFAULT_NVML_TIMEOUT, run_active
from .constants import SCHEMA
from .consumers import other_consumers, site_path, vllm_consumers
from .fatbin import sm_name
from .hooks import guard_hooks, read_record


def gather(
    environ: Mapping[str, str],
    toggles: Toggles,
    vllm_dir: str | None = None,
    active: bool = False,
    active_timeout: float = DEFAULT_ACTIVE_TIMEOUT,
    nvml_timeout: float = DEFAULT_NVML_TIMEOUT,
) -> dict[str, Any]:
    """The report without its findings (findings.conclude adds them)."""
    from ..stages.preview import preview_all

    path = site_path(vllm_dir, sys.path)
    package_dir = vllm_dir or find_package_dir("vllm")
    others = other_consumers(path)
    fatbins = read_fatbins(package_dir)
    record = read_record(toggles.record_dir)
    seen = preview_all(environ, toggles, "doctor", vllm_dir=package_dir)
    facts, gpus, supply = seen.facts, seen.gpus, seen.supply
    view = seen.record.to_json()
    hooks = guard_hooks(facts.vllm.found, facts.vllm.platform_plugins, environ, supply.supplies)
    consumers = consumer_rows(
        vllm_consumers(facts.vllm) + others,
        facts.driver,
        supply.supplies,
        toggles.mode == "auto" and hooks["hooked"],
        overlay_exports(),
    )
    driver = facts.driver
    return {
        "schema": SCHEMA,
        "tmaguard": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "active": active,
        "status": None,
        "exit_code": None,
        "elapsed_ms": None,
        "python": {"executable": sys.executable, "version": sys.version.split()[0]},
        "toggles": toggles._asdict(),
        "gpu": {
            **view["gpu"],
            "gpus": [
                {**g, "capability": list(gpu.compute_capability or ()), "sm": sm_name(gpu.compute_capability)}
                for g, gpu in zip(view["gpu"]["gpus"], gpus.gpus, strict=True)
            ],
        },
        "layers": view["layers"],
        "libcuda": {
            **view["libcuda"],
            "realpath": os.path.realpath(driver.path) if driver.path else None,
            "exports": len(driver.info.defined) if driver.info else None,
            "skipped": list(driver.resolution.skipped),
        },
        "vllm": {
            **view["vllm"],
            "package_dir": facts.vllm.package_dir,
            "imported_at_platform_load": list(facts.vllm.imported_at_platform_load),
        },
        "consumers": consumers,
        "architectures": architectures(fatbins, sorted(gpus.capabilities())),
        "guard": hooks,
        "decision": view,
        "record": record,
        "active_check": run_active(active_timeout, nvml_timeout) if active else None,
    }
