"""Findings about the guard: its routing verdict (TMA, overrides, paths no knob reaches), whether it runs in
vLLM processes started here with its libraries in place, and its last record."""

from __future__ import annotations

import os
from typing import Any

from ...codes import (
    CUDA_BROKEN,
    LAYER_WRITABLE,
    ROUTING_IMPOSSIBLE,
    ROUTING_OVERRIDE,
    TOGGLE_INVALID,
    TOGGLE_UNKNOWN,
)
from ...files import default_record_dir
from .base import finding, fix


def decision_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The guard's verdicts for a vLLM process started here (its record in validate mode)."""
    findings = []
    view = report["decision"]
    tma = view.get("tma")
    sm90 = any(g["capability"][:1] == [9] for g in report["gpu"]["gpus"])
    # Where no CUDA call can succeed (layers.py's findings say why), TMA is moot: never "usable" beside it.
    broken = any(problem["code"] in CUDA_BROKEN for problem in view["problems"])
    if tma and sm90 and not broken:
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
    for problem in [*view["problems"], *report.get("toggle_problems", [])]:
        if problem["code"] == ROUTING_IMPOSSIBLE:
            findings.append(
                finding(
                    "routing-error",
                    "error",
                    "The requested kernel routing cannot be had",
                    f"{problem['cause']}: {problem['consequence']}",
                    fix=fix("Set TMAGUARD_GEMM=auto.", env={"TMAGUARD_GEMM": "auto"}),
                )
            )
        elif problem["code"] == ROUTING_OVERRIDE:
            findings.append(
                finding(
                    "routing-override",
                    "warning",
                    "The guard overrides one of your settings",
                    problem["cause"],
                    subject=problem["subject"],
                )
            )
        elif problem["code"] == LAYER_WRITABLE:
            findings.append(
                finding(
                    "layer-writable",
                    "warning",
                    "Others can change the libcuda.so.1 every process here loads",
                    f"{problem['cause']}: {problem['consequence']}.",
                    subject=problem["subject"],
                    fix=fix(problem["fix"][:1].upper() + problem["fix"][1:] + "."),
                )
            )
        elif problem["code"] in (TOGGLE_INVALID, TOGGLE_UNKNOWN):
            findings.append(
                finding(
                    "toggle-invalid" if problem["code"] == TOGGLE_INVALID else "toggle-unknown",
                    "warning",
                    f"{problem['cause']}: {problem['consequence']}",
                    subject=problem["subject"],
                    fix=fix(problem["fix"]),
                )
            )
    routing = view.get("routing") or {}
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
    findings += record_file_findings(report["record"], report["libcuda"]["path"])
    return findings


def record_file_findings(record: dict[str, Any], libcuda: str | None) -> list[dict[str, Any]]:
    """Where the guard's records go and what the last one says; a file there that is not a record is a
    finding with its fix, never a failure of the doctor."""
    findings = []
    if record["refused"]:
        where = os.path.dirname(record["path"]) if record["path"] else None
        default = record["asked"] == default_record_dir()
        which = "the default record directory" if default else "TMAGUARD_RECORD_DIR"
        falls_back = f"The guard falls back to {where}." if where else "The guard writes no record anywhere."
        findings.append(
            finding(
                "record-dir-refused",
                "warning",
                f"The guard refuses {which} (it is not this user's alone)",
                f"{record['refused']}. {falls_back}",
                subject=record["asked"],
                fix=fix(_private_dir_fix(record["asked"], default, where is not None)),
            )
        )
    if record["error"]:
        findings.append(
            finding(
                "record-unreadable",
                "warning",
                "A file where the guard keeps its last record is not a record it wrote",
                record["error"],
                subject=record["path"],
                fix=fix(
                    f"Remove {record['path']}: the next vLLM process writes a new record there (if another "
                    "user keeps making it, set TMAGUARD_RECORD_DIR to a directory only this user can enter)."
                ),
            )
        )
    elif record["path"] is not None and not record["found"]:
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
    elif record["found"]:
        findings += _record_findings(record, libcuda)
    return findings + [_cache_finding(cache) for cache in record["unusable_caches"]]


def _cache_finding(cache: dict[str, str]) -> dict[str, Any]:
    """A cache file no vLLM process can read: each decides afresh (a slower start, the same verdict) until a
    full run replaces the file."""
    return finding(
        "cache-unusable",
        "info",
        "A cache file where the guard keeps its verdicts or vLLM scans cannot be read",
        f"{cache['error']}. vLLM processes decide afresh (the same verdict, a slower start) until one "
        "replaces the file, which it cannot where a directory stands in its place.",
        subject=cache["path"],
        fix=fix(f"Remove {cache['path']}: the next vLLM process writes it anew."),
    )


def _private_dir_fix(asked: str, default: bool, falls_back: bool) -> str:
    if default:
        return (
            f"Remove {asked} (another user may have made it) or set TMAGUARD_RECORD_DIR to a directory only "
            "this user can enter (0700)."
        )
    unset = ", or unset it" if falls_back else ""  # unset, it is the default: refused too
    return f"Point TMAGUARD_RECORD_DIR at a directory only this user can enter (0700){unset}."


def _record_findings(record: dict[str, Any], libcuda: str | None) -> list[dict[str, Any]]:
    """The last record's outcome, and what it says about where records go."""
    last = record["record"]
    if last.get("schema") != 2:
        return [
            finding(
                "record-old",
                "info",
                "The guard's last record is from another version of vllm-tmaguard",
                f"{record['path']}: schema {last.get('schema')!r}, this doctor reads schema 2.",
            )
        ]
    problems = last["problems"]
    written_with = last["libcuda"]["path"]
    elsewhere = (
        f" It was written with another libcuda.so.1 ({written_with}): perhaps by another container."
        if written_with != libcuda
        else ""
    )
    causes = "; ".join(p["cause"] for p in problems)
    findings = [
        finding(
            "record",
            "warning" if last["outcome"] == "degraded" else "info",
            f"The guard's last record ({last['trigger']}, pid {last['pid']}, {last['time']}): "
            f"{last['outcome']}",
            (f"Problems: {causes}. " if problems else "") + f"{last['summary']}.{elsewhere}",
        )
    ]
    return findings
