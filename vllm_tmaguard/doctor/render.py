"""The report for people (rich: colours only on a terminal, 100 columns when not on one) and for programs
(JSON, schema in docs/doctor.md)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from .findings.base import PROBLEMS


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=1) + "\n"


def render_text(report: dict[str, Any], file: TextIO | None = None) -> None:
    """The report for people (rich); colours only on a terminal, 100 columns when not on one."""
    from rich import box
    from rich.console import Console, Group
    from rich.table import Table
    from rich.text import Text

    console = Console(file=file or sys.stdout, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 100
    style = {"error": "bold red", "warning": "yellow", "info": "cyan", "ok": "green"}

    def grid(label_width: int) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(no_wrap=True, width=label_width, style="bold")
        table.add_column(overflow="fold", ratio=1)
        return table

    def section(title: str) -> None:
        console.print()
        console.print(Text(title, style="bold underline"))

    how = (
        "active: CUDA initialised in child processes"
        if report["active"]
        else "passive: no torch or vLLM import, no CUDA context; NVML asked in a child process"
    )
    console.print(Text(f"tmaguard doctor {report['tmaguard']} ({how})", style="bold"))
    console.print()

    facts = grid(12)
    gpu = report["gpu"]
    for g in gpu["gpus"]:
        mig = {True: "MIG on", False: "MIG off", None: "MIG n/a"}[g["mig"]]
        facts.add_row(
            f"GPU {g['index']}",
            f"{g['name']}, {g['compute_capability']} ({g['sm']}), {mig}, "
            f"virtualization {g['virtualization'] or 'n/a'}",
        )
    if gpu["gpus"]:
        cuda = gpu["cuda_driver_version"]
        cuda_text = f" (CUDA {cuda // 1000}.{cuda % 1000 // 10})" if cuda else ""
        facts.add_row("Driver", f"{gpu['driver_version']}{cuda_text}")
    else:
        facts.add_row("GPU", gpu["error"] or "none (NVML: 0 devices)")
    for layer in report["layers"]:
        facts.add_row("Layer", f"{layer['name']} ({'; '.join(layer['evidence'])})")
    if not report["layers"]:
        facts.add_row("Layer", "none detected")
    libcuda = report["libcuda"]
    if libcuda["path"]:
        line = f"{libcuda['path']} (via {libcuda['how']}), SONAME {libcuda['soname']}"
        if libcuda["overlay_of"]:
            line += f"; the guard's overlay in front of {libcuda['overlay_of']}"
        if libcuda["real_driver"]:
            line += f"; real driver beside it: {libcuda['real_driver']}"
        if libcuda["error"]:
            line += f"; unreadable: {libcuda['error']}"
        facts.add_row("libcuda.so.1", line)
    else:
        skipped = f" (passed over: {'; '.join(libcuda['skipped'])})" if libcuda["skipped"] else ""
        facts.add_row("libcuda.so.1", "not found" + skipped)
    vllm = report["vllm"]
    facts.add_row("vLLM", f"{vllm['version']} at {vllm['package_dir']}" if vllm["found"] else "not found")
    guard = report["guard"]
    hooks = [
        name
        for name, on in (
            ("platform plugin", guard["platform_plugin_runs"]),
            (".pth hook", guard["import_hook"]),
        )
        if on
    ]
    facts.add_row(
        "Guard",
        f"{guard['version']}, TMAGUARD_MODE={report['toggles']['mode']}, runs through "
        f"{' and '.join(hooks) or 'nothing'}: {report['decision'].get('summary')}",
    )
    record = report["record"]
    if record["found"]:
        last = record["record"]
        facts.add_row("Last record", f"{record['path']}: {last.get('time')}, {last.get('summary')}")
    else:
        facts.add_row(
            "Last record", f"none at {record['path']}" + (f" ({record['error']})" if record["error"] else "")
        )
    console.print(facts)

    known = report["libcuda"]["path"] is not None and not report["libcuda"]["error"]
    rows = [r for r in report["consumers"] if (r["needs"] and known) or r["error"]]
    if rows:
        section("Driver entry points by consumer")
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        table.add_column("consumer", no_wrap=True)
        table.add_column("asks", overflow="fold", ratio=2)
        table.add_column("libcuda.so.1 lacks", overflow="fold", ratio=4)
        table.add_column("covered by", overflow="fold", ratio=2)
        for r in rows:
            asks = "its own handle" if r["scope"] == "handle" else "global scope"
            if r["error"]:
                table.add_row(r["name"], asks, Text(f"unreadable: {r['error']}", style="red"), "")
                continue
            lacks = "?" if r["lacks"] is None else ", ".join(r["lacks"]) or "-"
            cover = ", ".join(sorted(set(r["coverage"].values()))) or "-"
            table.add_row(r["name"], asks, lacks, cover)
        console.print(table)

    architectures = report["architectures"]
    if architectures["extensions"]:
        devices = architectures["devices"]
        section("GPU code in vLLM's extensions")
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        table.add_column("extension", no_wrap=True)
        table.add_column("SASS", overflow="fold", ratio=4)
        table.add_column("PTX", overflow="fold", ratio=3)
        for sm in devices:
            table.add_column(f"on {sm}", overflow="fold", ratio=3)
        for e in architectures["extensions"]:
            if e["error"]:
                table.add_row(
                    e["module"], Text(f"unreadable: {e['error']}", style="red"), "", *["" for _ in devices]
                )
                continue
            cells = []
            for sm in devices:
                c = e["coverage"][sm]
                if c["verdict"] == "partial":
                    cells.append(
                        f"native in {c['native']} of {e['fatbins']}"
                        + (f", JIT {c['jit']}" if c["jit"] else "")
                    )
                else:
                    cells.append({"jit": "PTX JIT only", "none": "none"}.get(c["verdict"], c["verdict"]))
            table.add_row(e["module"], " ".join(e["sass"]) or "-", " ".join(e["ptx"]) or "-", *cells)
        console.print(table)

    routing = report["decision"].get("routing") or {}
    if routing.get("families"):
        section("Kernel routing (what the guard sets in vLLM processes)")
        plan = grid(22)
        for family in routing["families"]:
            plan.add_row(family["family"], f"{family['path']} ({family['why']})")
        for key, value in (routing.get("env") or {}).items():
            plan.add_row("sets", f"{key}={value}")
        console.print(plan)

    section("Findings")
    findings = Table.grid(padding=(0, 2))
    findings.add_column(no_wrap=True, width=7)
    findings.add_column(overflow="fold", ratio=1)
    shown: set[str] = set()
    for finding in report["findings"]:
        body = [Text(finding["title"], style="bold")]
        if finding["detail"]:
            body.append(Text(finding["detail"]))
        if finding["fix"] and finding["fix"]["text"]:
            text = finding["fix"]["text"]
            body.append(Text("fix: " + (text if text not in shown else "as above"), style="italic"))
            shown.add(text)
        findings.add_row(Text(finding["severity"].upper(), style=style[finding["severity"]]), Group(*body))
    console.print(findings)

    fix = report["fix"]
    if fix["steps"] or fix["manifest"]:
        section("Fix")
        steps = Table.grid(padding=(0, 1))
        steps.add_column(no_wrap=True)
        steps.add_column(overflow="fold", ratio=1)
        for number, step in enumerate(fix["steps"], 1):
            steps.add_row(f"{number}.", step)
        console.print(steps)
        if fix["manifest"]:
            console.print("In the container spec:")
            for line in fix["manifest"].splitlines():
                console.print("  " + line, overflow="fold")
    problems = sum(f["severity"] in PROBLEMS for f in report["findings"])
    console.print()
    summary = "healthy" if not problems else f"{problems} problem{'s' if problems > 1 else ''} found"
    console.print(
        Text(
            f"{summary} (exit {report['exit_code']}), {report['elapsed_ms']} ms",
            style="bold green" if not problems else "bold red",
        )
    )
