"""The doctor's report: what the guard's probes find here (facts.probe, decide, build_record: the same
answers a vLLM process started here would get), asked passively, plus what only the doctor asks (hooks.py,
binaries.py, NVML and --active in child processes). Never raises for what it finds: an unreadable file or a
hanging NVML is a finding (findings/)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from .. import __version__
from ..consumers import other_consumers, site_path, vllm_consumers
from ..fatbin import sm_name
from ..toggles import Toggles
from ..vllm_probe import find_package_dir
from .binaries import architectures, consumer_rows, read_fatbins
from .children import (
    DEFAULT_ACTIVE_TIMEOUT,
    DEFAULT_NVML_TIMEOUT,
    gpu_facts_from,
    run_active,
    start_gpu_query,
)
from .constants import SCHEMA
from .hooks import guard_hooks, read_record


def gather(
    environ: Mapping[str, str],
    toggles: Toggles,
    nvml_timeout: float = DEFAULT_NVML_TIMEOUT,
    vllm_dir: str | None = None,
    active: bool = False,
    active_timeout: float = DEFAULT_ACTIVE_TIMEOUT,
) -> dict[str, Any]:
    """The report without its findings (findings.conclude adds them)."""
    nvml = start_gpu_query(nvml_timeout)  # runs while the imports and file probes below do their work
    from ..actions import Outcome
    from ..decision import decide
    from ..facts import probe
    from ..record import build_record

    path = site_path(vllm_dir, sys.path)
    package_dir = vllm_dir or find_package_dir("vllm")
    others = other_consumers(path)
    fatbins = read_fatbins(package_dir)
    record = read_record(toggles.record_dir)
    gpu_result, gpu_run = nvml.collect()
    gpu = gpu_facts_from(gpu_result, gpu_run)
    facts = probe(environ, toggles.root, "doctor", gpu=gpu, vllm_dir=package_dir)
    decision = decide(facts, toggles)
    hooks = guard_hooks(facts.vllm.found, facts.vllm.platform_plugins, environ, decision.supplies)
    consumers = consumer_rows(
        vllm_consumers(facts.vllm) + others,
        facts.driver,
        decision.supplies,
        decision.apply and hooks["hooked"],
    )
    # The guard's own record for a vLLM process started here; the report's facts extend its sections.
    view = build_record(facts, dataclasses.replace(decision, apply=False), Outcome(), toggles.mode, 0.0)
    view.pop("elapsed_ms", None)
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
        "toggles": dataclasses.asdict(toggles),
        "gpu": {
            **view["gpu"],
            "gpus": [
                {**g, "sm": sm_name(gpu.gpus[i].compute_capability)}
                for i, g in enumerate(view["gpu"]["gpus"])
            ],
            "query": {"how": "NVML in a child process", **gpu_run},
        },
        "layers": [
            {**layer, "forwards_to_local_driver": found.forwards_to_local_driver}
            for layer, found in zip(view["layer"], facts.layers, strict=True)
        ],
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
        "architectures": architectures(fatbins, sorted(gpu.capabilities())),
        "guard": hooks,
        "decision": view,
        "record": record,
        "active_check": run_active(active_timeout) if active else None,
    }
