"""Findings from --active: what NVML and the plain and the guarded child processes got from CUDA
(children.py)."""

from __future__ import annotations

from typing import Any

from ...codes import OVERLAY_FAILED, SHIM_FAILED
from ...stages.layers import LABELS
from .base import finding, fix

_ACTION_FAILURES = frozenset({OVERLAY_FAILED, SHIM_FAILED})


def nvml_findings(nvml: dict[str, Any]) -> list[dict[str, Any]]:
    """What NVML answered in its child process (the pod's libnvidia-ml.so.1, as vLLM will ask it)."""
    result, run = nvml["result"], nvml["run"]
    if run["timed_out"]:
        return [
            finding(
                "nvml-timeout",
                "error",
                f"NVML did not answer within {run['timeout_s']:g} s",
                "The NVML query (in a child process) hung and was killed. vLLM detects CUDA through NVML at "
                "start-up, so it hangs the same way.",
                fix=fix(
                    "Check the sharing layer's NVML and the daemon or socket it talks to (vCUDA: "
                    "/etc/vcuda/vcuda.sock); rerun with --nvml-timeout SECONDS to wait longer."
                ),
            )
        ]
    if result is None or result.get("error"):
        crashed = result is None
        why = (
            f"the NVML query process exited with status {run['exit_status']} before answering"
            + (f": {run['stderr_tail'].splitlines()[-1]}" if run["stderr_tail"] else "")
            if crashed
            else result["error"]
        )
        return [
            finding(
                "nvml-crashed" if crashed else "nvml-error",
                "error",
                "NVML query crashed" if crashed else "NVML cannot report the GPUs",
                f"{why}. vLLM detects CUDA through NVML: without it vLLM does not use the GPU.",
                fix=fix(
                    "Mount the driver's libnvidia-ml.so.1 (NVIDIA container toolkit, "
                    "NVIDIA_DRIVER_CAPABILITIES=compute,utility) or fix the sharing layer's NVML."
                ),
            )
        ]
    findings = []
    for gpu in result["gpus"]:
        if gpu.get("mig"):
            findings.append(
                finding(
                    "mig",
                    "info",
                    f"GPU {gpu['index']} is in MIG mode",
                    "Each MIG instance is its own CUDA device; address it by its MIG UUID.",
                    subject=str(gpu["index"]),
                )
            )
        if gpu.get("virtualization") not in (None, "none"):
            findings.append(
                finding(
                    "virtualization",
                    "info",
                    f"GPU {gpu['index']} virtualization mode: {gpu['virtualization']}",
                    "An NVIDIA vGPU guest or pass-through: the driver inside is NVIDIA's.",
                    subject=str(gpu["index"]),
                )
            )
    return findings


def _step_failure(result: dict[str, Any]) -> str:
    failed = next((step for step in result["steps"] if step.get("error") or step.get("result")), None)
    if failed is None:
        return result.get("error") or "no result"
    return f"{failed['call']}: " + (failed.get("error") or f"returned {failed['result']} ({failed['name']})")


def _encode_finding(key: str, label: str, result: dict[str, Any], newer: bool) -> dict[str, Any] | None:
    encode = result.get("encode")
    means = result.get("shim_source_means")
    where = f" Bound from {result['bound_from']}" if result.get("bound_from") else ""
    where += (f", reached through {means}." if means else ".") if where else ""
    if encode and encode.get("result") == 0:
        return finding(
            "active-encode-ok",
            "ok",
            f"{label}: cuTensorMapEncodeTiled returned 0 (CUDA_SUCCESS) on a real allocation",
            where.strip(),
            subject=key,
        )
    if encode:
        return finding(
            "active-encode-failed",
            "error" if newer else "info",
            f"{label}: cuTensorMapEncodeTiled returned {encode.get('result')} "
            f"({encode.get('name') or encode.get('error')})",
            "TMA kernels would fail" + ("." if newer else " (none runs below sm_90).") + where,
            subject=key,
        )
    return None


def preload_findings(plain: dict[str, Any]) -> list[dict[str, Any]]:
    """Whether each preloaded sharing layer is mapped in a fresh process (the plain child's
    /proc/self/maps): in force where one of its entries is. What the loader said of the others is on that
    process's standard error."""
    rows = (plain["result"] or {}).get("preloads") or []
    said = [line for line in (plain["run"]["stderr_tail"] or "").splitlines() if "ld.so" in line]
    findings = []
    for layer in dict.fromkeys(row["layer"] for row in rows):
        entries = [row for row in rows if row["layer"] == layer]
        label, mapped = LABELS.get(layer, layer), [row["entry"] for row in entries if row["mapped"]]
        if mapped:
            findings.append(
                finding(
                    "active-layer-in-force",
                    "ok",
                    f"{label} is loaded in a fresh process",
                    f"{mapped[0]} is in the /proc/self/maps of a process started here.",
                    subject=layer,
                )
            )
            continue
        named = "; ".join(f"{row['entry']} (from {row['source']})" for row in entries)
        findings.append(
            finding(
                "active-layer-not-in-force",
                "error",
                f"{label} is NOT loaded in a fresh process: its limits are not in force",
                f"None of its preload entries is in the /proc/self/maps of a process started here: {named}. "
                "Every CUDA call there goes to NVIDIA's driver unmetered."
                + (f" The loader said: {' '.join(said)}" if said else ""),
                subject=layer,
                fix=fix(
                    "Make the entries loadable (the layer-not-in-force finding says why each is skipped and "
                    "how to fix it), then restart the pod."
                ),
            )
        )
    return findings


def active_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    active = report["active_check"]
    if active is None:
        return []
    findings = nvml_findings(active["nvml"]) + preload_findings(active["plain"])
    newer = any(g["capability"] and g["capability"][0] >= 9 for g in report["gpu"]["gpus"])
    for key in ("guarded", "plain"):
        result, run = active[key]["result"], active[key]["run"]
        if result is None or result.get("error"):
            why = (
                "timed out"
                if run["timed_out"]
                else result["error"]
                if result
                else f"exited with status {run['exit_status']}"
            )
            findings.append(
                finding(
                    "active-crashed",
                    "error",
                    f"Active check ({key}) {why}",
                    run["stderr_tail"] or "",
                    subject=key,
                )
            )
            continue
        if key == "guarded":
            guard = result.get("guard")
            failed = [p for p in (guard or {}).get("problems") or [] if p["code"] in _ACTION_FAILURES]
            if failed:
                findings.append(
                    finding(
                        "active-guard-failed",
                        "error",
                        "The guard's actions failed in a fresh process",
                        "; ".join(p["cause"] for p in failed),
                        subject=key,
                    )
                )
            binding = result["binding"]
            found = _encode_finding(key, "vLLM's binding, after the guard", binding, newer)
            findings.append(
                found
                or finding(
                    "active-init-failed",
                    "error",
                    "CUDA does not initialise through libcuda.so.1 (after the guard)",
                    _step_failure(binding),
                    subject=key,
                )
            )
        cuda_python = result["cuda_python"]
        label = (
            "cuda-python in a vLLM process (after the guard)" if key == "guarded" else "cuda-python, plain"
        )
        if not cuda_python["available"]:
            if key == "plain":
                findings.append(
                    finding(
                        "active-cuda-python-missing",
                        "info",
                        "cuda-python is not installed: its check did not run",
                        cuda_python["error"] or "",
                        subject=key,
                        fix=fix("pip install 'vllm-tmaguard[active]'"),
                    )
                )
            continue
        found = _encode_finding(f"{key}-cuda-python", label, cuda_python, newer)
        if found is None:
            guarded_ok = ((active["guarded"]["result"] or {}).get("cuda_python") or {}).get("encode") or {}
            severity = "warning" if key == "guarded" or guarded_ok.get("result") != 0 else "info"
            found = finding(
                "active-cuda-python-failed",
                severity,
                f"{label}: fails before the encode",
                _step_failure(cuda_python)
                + (" (inside vLLM processes the guard fixes this)" if severity == "info" else ""),
                subject=f"{key}-cuda-python",
            )
        findings.append(found)
    return findings
