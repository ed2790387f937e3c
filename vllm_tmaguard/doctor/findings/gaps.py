"""Findings about the entry points libcuda.so.1 lacks, consumer by consumer (binaries.py): supplied by the
guard, left to a guard that is off, or unfixed, and why; and consumers whose files are damaged or missing."""

from __future__ import annotations

from typing import Any

from ...codes import HANDLE_SCOPED_GAP
from ...stages.catalogue import ENCODERS, LAUNCH_EX, PROC_ADDRESS_V2
from .base import SEVERITIES, finding, fix

_HANDLE_EFFECTS = {
    ("triton", LAUNCH_EX): ("error", "every Triton kernel launch fails"),
    ("triton", "cuTensorMapEncodeTiled"): ("warning", "Triton kernels with host-side TMA descriptors fail"),
    ("triton", "cuTensorMapEncodeIm2col"): ("warning", "Triton kernels with host-side TMA descriptors fail"),
    ("triton", "cuOccupancyMaxActiveClusters"): (
        "info",
        "Triton's cluster occupancy query fails (rarely used)",
    ),
    ("cuda-runtime", PROC_ADDRESS_V2): (
        "warning",
        "the CUDA runtime falls back to looking each entry point up by name; cudaGetDriverEntryPoint "
        "cannot reach what the layer lacks (e.g. the tensor-map encoders for torch's CUTLASS kernels)",
    ),
    ("cuda-python", PROC_ADDRESS_V2): (
        "warning",
        "cuda.bindings.driver cannot initialise (RuntimeError: Failed to get cuGetProcAddress_v2)",
    ),
}
_EFFECT = {
    "vllm-extension": ("error", "vLLM fails to import it"),
    "torch-library": ("warning", "torch fails to load it"),
    "cuda-runtime": ("warning", "the CUDA runtime cannot reach it"),
    "triton": ("error", "Triton cannot launch"),
    "cuda-python": ("warning", "cuda-python cannot use it"),
}
# What vCUDA forks export beyond upstream vCUDA (layers.py tells the two apart by the same names).
_FORK_EXPORTS = {PROC_ADDRESS_V2, *ENCODERS}


def gap_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    readable = [row for row in report["consumers"] if not row["error"]]
    return (
        _file_findings(report["consumers"])
        + _handle_findings(report, readable)
        + _global_findings(report, readable)
    )


def _file_findings(consumers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A damaged file is a finding of its own; missing files are one finding that lists them."""
    findings = []
    missing = [row for row in consumers if row["absent"]]
    for row in consumers:
        if row["error"] and not row["absent"]:
            findings.append(
                finding(
                    "consumer-unreadable",
                    "error" if row["kind"] == "vllm-extension" else "warning",
                    f"{row['name']} cannot be read",
                    f"{row['path']}: {row['error']}. The loader will fail on it too.",
                    subject=row["name"],
                    fix=fix("Reinstall the package that ships it."),
                )
            )
    if missing:
        findings.append(
            finding(
                "consumers-missing",
                "error" if any(row["kind"] == "vllm-extension" for row in missing) else "warning",
                f"{len(missing)} extension file{'s are' if len(missing) > 1 else ' is'} missing",
                "Listed by their packages' file lists but not on disk: "
                + "; ".join(row["path"] for row in missing)
                + ". Importing any of them fails.",
                fix=fix("Reinstall the packages that ship them (vLLM: pip install --force-reinstall vllm)."),
            )
        )
    return findings


def _handle_findings(report: dict[str, Any], readable: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consumers that look names up in libcuda.so.1's own handle, for names nothing there answers."""
    gaps = [(row, [s for s, cover in row["coverage"].items() if cover == "none"]) for row in readable]
    gaps = [(row, lacking) for row, lacking in gaps if lacking and row["scope"] == "handle"]
    names = sorted({s for _, lacking in gaps for s in lacking})
    vcuda = any(layer["name"] in ("vcuda", "vcuda-fork") for layer in report["layers"])
    layer_build = f"use a build of the sharing layer whose libcuda.so.1 exports {', '.join(names)}" + (
        " (vCUDA forks do)" if vcuda and set(names) <= _FORK_EXPORTS else ""
    )
    gap_problems = [p for p in report["decision"]["problems"] if p["code"] == HANDLE_SCOPED_GAP]
    findings = []
    for row, lacking in gaps:
        effects = sorted(
            (_HANDLE_EFFECTS.get((row["kind"], s), ("warning", f"{s} cannot be used")) for s in lacking),
            key=lambda effect: SEVERITIES.index(effect[0]),
        )
        consequences = "; ".join(dict.fromkeys(e[1] for e in effects))
        blockers = [p["cause"] for p in gap_problems if p["symbol"] in lacking]
        if report["toggles"].get("overlay") == "off":
            why = "TMAGUARD_OVERLAY=off keeps the guard's overlay out."
            remedy = fix("Let the guard load its overlay.", env={"TMAGUARD_OVERLAY": "auto"})
        elif blockers:
            why, remedy = " ".join(blockers) + ".", fix(f"See `tmaguard env`; or {layer_build}.")
        else:
            why = "the guard's overlay does not carry it."
            remedy = fix(f"{layer_build[0].upper()}{layer_build[1:]}.")
        findings.append(
            finding(
                "gap-handle-unfixed",
                effects[0][0],
                f"{row['name']}: libcuda.so.1 lacks {', '.join(lacking)}",
                f"{consequences[0].upper()}{consequences[1:]}. {row['name']} asks its own "
                f'dlopen("libcuda.so.1") handle ({row["evidence"]}), which an RTLD_GLOBAL shim cannot '
                f"reach: {why}",
                subject=row["name"],
                fix=remedy,
            )
        )
    return findings


def _global_findings(report: dict[str, Any], readable: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each name libcuda.so.1 lacks, with every consumer that needs it and how the gap is covered."""
    by_symbol: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in readable:
        for symbol, cover in row["coverage"].items():
            if cover != "none" or row["scope"] != "handle":
                by_symbol.setdefault((symbol, cover), []).append(row)
    findings = []
    for (symbol, cover), rows in sorted(by_symbol.items()):
        names = ", ".join(row["name"] for row in rows)
        effects = "; ".join(sorted({_EFFECT.get(r["kind"], ("warning", "it fails"))[1] for r in rows}))
        if cover in ("shim", "overlay"):
            how = (
                "the guard's overlay (the process's libcuda.so.1: the layer plus what it lacks)"
                if cover == "overlay"
                else "the guard's RTLD_GLOBAL shim"
            )
            findings.append(
                finding(
                    "gap-supplied",
                    "ok",
                    f"{symbol}: missing from libcuda.so.1, supplied by the guard ({cover})",
                    f"Needed by {names}; supplied by {how} before vLLM imports its extensions.",
                    subject=symbol,
                )
            )
        elif cover == "off":
            mode = report["toggles"]["mode"]
            why = f"TMAGUARD_MODE={mode}" if mode != "auto" else "the guard is not hooked into vLLM"
            remedy = (
                fix("Let the guard supply it.", env={"TMAGUARD_MODE": "auto"})
                if mode != "auto" or report["guard"]["hooked"]
                else fix("Reinstall vllm-tmaguard into vLLM's Python environment.")
            )
            findings.append(
                finding(
                    "gap-guard-off",
                    "error",
                    f"{symbol}: missing from libcuda.so.1, and the guard will not supply it ({why})",
                    f"Needed by {names}: {effects}.",
                    subject=symbol,
                    fix=remedy,
                )
            )
        else:
            findings.append(
                finding(
                    "gap-unfixed",
                    "error" if any(r["kind"] == "vllm-extension" for r in rows) else "warning",
                    f"{symbol}: missing from libcuda.so.1, and nothing supplies it",
                    f"Needed by {names}: {effects} where it is used. The guard forwards only "
                    "entry points no sharing layer meters; this one would bypass the layer's quota.",
                    subject=symbol,
                    fix=fix(f"Use a build of the sharing layer that exports {symbol}."),
                )
            )
    return findings
