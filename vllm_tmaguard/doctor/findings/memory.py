"""Findings about what vLLM is started with that the pod cannot take (memory.py, compat.py): the layer's
memory limit against vLLM's share of it, vLLM's compat switch under a layer that replaces libcuda.so.1, a
configured layer this process bypasses; and, with --active, the limit against what CUDA and NVML show a
fresh process (a limit that CUDA does not show is not in force)."""

from __future__ import annotations

from typing import Any

from ...codes import COMPAT_BYPASSES_LAYER, LAYER_BYPASSED, MEMORY_FRACTION_TOO_HIGH, MEMORY_UNENFORCED
from .base import finding, fix

GIB = 1 << 30
# A limit is shown as the device when cuMemGetInfo's total is within this of it (layers round to MiB).
_SHOWN_WITHIN = 64 << 20
_SEVERITY = {
    MEMORY_FRACTION_TOO_HIGH: "warning",
    MEMORY_UNENFORCED: "warning",
    COMPAT_BYPASSES_LAYER: "warning",
    LAYER_BYPASSED: "error",
}


def _gib(size: int) -> str:
    return f"{size / GIB:.2f} GiB"


def memory_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The decision's memory plan and its launch problems, for a vLLM server started here (the doctor does
    not see the command line vLLM will be given)."""
    view = report["decision"]
    memory = view.get("memory") or {}
    findings = []
    for problem in view["problems"]:
        severity = _SEVERITY.get(problem["code"])
        if severity:
            fits = memory.get("fits") if problem["code"] == MEMORY_FRACTION_TOO_HIGH else None
            args = ["--gpu-memory-utilization", fits] if fits else []
            findings.append(
                finding(
                    problem["code"],
                    severity,
                    problem["cause"],
                    problem["consequence"],
                    subject=problem["subject"],
                    fix=fix(problem["fix"], vllm_args=args),
                )
            )
    if memory.get("limit_bytes") and memory.get("set_to"):
        findings.append(
            finding(
                "memory-fraction-set",
                "info",
                f"The layer's memory limit is {_gib(memory['limit_bytes'])} ({memory['limit_source']}): "
                "vLLM's "
                f"default --gpu-memory-utilization does not start under it; the guard gives `vllm serve` "
                f"--gpu-memory-utilization {memory['set_to']}",
                f"A --gpu-memory-utilization of yours above {memory['fits']} does not start either (the "
                "guard's line warns); TMAGUARD_MEMORY=warn leaves vLLM's default and warns.",
                subject="--gpu-memory-utilization",
            )
        )
    return findings + _shown_findings(report, memory.get("limit_bytes"), memory.get("limit_source"))


def _shown_findings(report: dict[str, Any], limit: int | None, source: str | None) -> list[dict[str, Any]]:
    """--active: the configured limit against cuMemGetInfo in the guarded child and NVML's total."""
    active = report.get("active_check")
    if not active or not limit:
        return []
    result = (active.get("guarded") or {}).get("result") or {}
    shown = (result.get("binding") or {}).get("memory")
    nvml_result = (active.get("nvml") or {}).get("result") or {}  # None where NVML hung or crashed
    nvml = [g.get("memory_total") for g in nvml_result.get("gpus") or []]
    if shown is None:
        return []
    seen = f"cuMemGetInfo shows {_gib(shown['total'])} ({_gib(shown['free'])} free)"
    seen += f", NVML {_gib(nvml[0])}" if nvml and nvml[0] else ""
    if abs(shown["total"] - limit) <= _SHOWN_WITHIN:
        return [finding("memory-limit-shown", "ok", f"The {_gib(limit)} limit is what CUDA shows", seen)]
    return [
        finding(
            "memory-limit-not-shown",
            "error",
            f"The layer's {_gib(limit)} limit ({source}) is not what CUDA shows a new process: {seen}",
            "vLLM sizes itself from cuMemGetInfo: the limit is not in force, or the layer shows another.",
            fix=fix(
                "Check that the layer's library is loaded in vLLM's processes (tmaguard doctor's layer "
                "findings name a preload that did not take)."
            ),
        )
    ]
