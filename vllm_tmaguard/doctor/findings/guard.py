"""Findings about the guard: its routing verdict (TMA, overrides, paths no knob reaches), whether it runs in
vLLM processes started here with its libraries in place, and its last record."""

from __future__ import annotations

from typing import Any

from .base import finding, fix


def decision_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    findings = []
    view = report["decision"]
    tma = view.get("tma")
    sm90 = any(g["compute_capability"].startswith("9.") for g in report["gpu"]["gpus"])
    if tma and sm90:
        findings.append(
            finding(
                "tma",
                "ok" if tma["usable"] else "info",
                "TMA usable on sm_90"
                if tma["usable"]
                else "TMA unusable on sm_90: the guard routes vLLM's TMA kernels away",
                tma["reason"],
            )
        )
    routing = view.get("routing") or {}
    if routing.get("error"):
        findings.append(
            finding(
                "routing-error",
                "error",
                "The requested kernel routing cannot be had",
                routing["error"],
                fix=fix("Set TMAGUARD_GEMM=auto.", env={"TMAGUARD_GEMM": "auto"}),
            )
        )
    for override in routing.get("overrides", []):
        findings.append(
            finding("routing-override", "warning", "The guard overrides one of your settings", override)
        )
    for hint in routing.get("hints", []):
        findings.append(
            finding(
                "routing-no-knob", "warning", "A TMA path no environment knob reaches", hint, fix=fix(hint)
            )
        )
    return findings


def guard_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    findings = []
    guard = report["guard"]
    supplies = [supply["library"] for supply in guard["supplies"]]
    if supplies and not guard["hooked"]:
        findings.append(
            finding(
                "guard-not-hooked",
                "error",
                "The guard does not run in vLLM processes started here",
                f"No platform-plugin entry point runs (VLLM_PLUGINS={guard['vllm_plugins']!r}) and the .pth "
                "import hook is missing.",
                fix=fix("Add tmaguard to VLLM_PLUGINS, or reinstall vllm-tmaguard into vLLM's environment."),
            )
        )
    for supply in guard["supplies"]:
        if not supply["file_exists"]:
            findings.append(
                finding(
                    "library-missing",
                    "error",
                    f"The guard's {supply['library']} library is missing",
                    f"{supply['file']}: vllm-tmaguard was installed without its compiled libraries.",
                    subject=supply["library"],
                    fix=fix("Reinstall vllm-tmaguard from a wheel (or with a C compiler present)."),
                )
            )
    record = report["record"]
    if record["error"]:
        findings.append(
            finding(
                "record-unreadable",
                "warning",
                "The guard's last record cannot be read",
                f"{record['path']}: {record['error']}",
            )
        )
    elif not record["found"]:
        findings.append(
            finding(
                "record-missing",
                "info",
                "No record from the guard yet",
                f"No {record['path']}: vLLM has not started here with the guard, or wrote its record "
                "elsewhere "
                "(TMAGUARD_RECORD_DIR must be the same for vLLM and the doctor; an init or debug container "
                "has its own /tmp).",
            )
        )
    else:
        last = record["record"]
        failed = last.get("failed") or []
        written_with = (last.get("libcuda") or {}).get("path")
        elsewhere = (
            f" It was written with another libcuda.so.1 ({written_with}): perhaps by another container."
            if written_with != report["libcuda"]["path"]
            else ""
        )
        findings.append(
            finding(
                "record",
                "warning" if failed else "info",
                f"The guard's last record ({last.get('trigger')}, pid {last.get('pid')}, {last.get('time')})",
                (f"Failed: {'; '.join(failed)}. " if failed else "") + f"{last.get('summary')}.{elsewhere}",
            )
        )
    return findings
