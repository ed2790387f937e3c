"""Findings from --active: what the plain and the guarded child processes got from CUDA (children.py)."""

from __future__ import annotations

from typing import Any

from .base import finding, fix


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


def active_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    active = report["active_check"]
    if active is None:
        return []
    findings = []
    newer = any(int(g["compute_capability"].split(".")[0]) >= 9 for g in report["gpu"]["gpus"])
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
            if guard and guard.get("failed"):
                findings.append(
                    finding(
                        "active-guard-failed",
                        "error",
                        "The guard's actions failed in a fresh process",
                        "; ".join(guard["failed"]),
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
