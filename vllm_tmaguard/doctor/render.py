"""The report for people (rich: colours only on a terminal, 100 columns when not on one, no trailing spaces)
and for programs (JSON, schema in docs/doctor.md). One function per section."""

from __future__ import annotations

import io
import json
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from .findings.base import PROBLEMS

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan", "ok": "green"}


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=1) + "\n"


def render_text(report: dict[str, Any], file: TextIO | None = None) -> None:
    """The report for people. Off a terminal it is written without colour and without the spaces rich pads
    each line with (they would land in log files and diffs)."""
    from rich.console import Console

    out = file or sys.stdout
    terminal = out.isatty()
    encoding = getattr(out, "encoding", None) or "utf-8"
    buffer = _Buffer(encoding)
    width = None if terminal or "COLUMNS" in os.environ else 100
    console = Console(file=buffer, highlight=False, width=width, force_terminal=terminal or None)
    for section in (_header, _facts, _consumers, _architectures, _routing, _findings, _fix, _summary):
        section(console, report)
    text = buffer.getvalue()
    if not terminal:
        text = "".join(line.rstrip() + "\n" for line in text.splitlines())
    out.write(text.encode(encoding, "backslashreplace").decode(encoding))


class _Buffer(io.StringIO):
    """What rich writes into, in the encoding of the stream the report goes to: on one that is not UTF-8
    (a `kubectl exec` without a UTF-8 locale), rich draws its tables in ASCII; a character the encoding
    lacks (a path's) is then written as a backslash escape."""

    def __init__(self, encoding: str) -> None:
        super().__init__()
        self._encoding = encoding

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding


def _grid(label_width: int) -> Table:
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True, width=label_width, style="bold")
    table.add_column(overflow="fold", ratio=1)
    return table


def _table(*columns: tuple[str, dict[str, Any]]) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name, options in columns:
        table.add_column(name, **options)
    return table


def _section(console: Console, title: str) -> None:
    from rich.text import Text

    console.print()
    console.print(Text(title, style="bold underline"))


def _header(console: Console, report: dict[str, Any]) -> None:
    from rich.text import Text

    how = (
        "active: NVML and CUDA initialised in child processes"
        if report["active"]
        else "passive: no torch or vLLM import, no CUDA context, no NVML"
    )
    console.print(Text(f"tmaguard doctor {report['tmaguard']} ({how})", style="bold"))
    console.print()


def _facts(console: Console, report: dict[str, Any]) -> None:
    facts = _grid(12)
    gpu = report["gpu"]
    for g in gpu["gpus"]:
        capability = f"{g['compute_capability']} ({g['sm']})" if g["compute_capability"] else "unknown model"
        facts.add_row(f"GPU {g['index']}", f"{g['name']}, {capability}")
    if gpu["gpus"]:
        cuda = gpu["cuda_driver_version"]
        cuda_text = f" (CUDA {cuda // 1000}.{cuda % 1000 // 10})" if cuda else ""
        facts.add_row("Driver", f"{gpu['driver_version']}{cuda_text}")
    else:
        facts.add_row("GPU", gpu["error"] or "none given to this container")
    for layer in report["layers"]:
        facts.add_row("Layer", f"{layer['label']} ({'; '.join(layer['evidence'])})")
    if not report["layers"]:
        facts.add_row("Layer", "none detected")
    facts.add_row("libcuda.so.1", _libcuda_line(report["libcuda"]))
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
        f"{' and '.join(hooks) or 'nothing'}: {report['decision']['summary']}",
    )
    record = report["record"]
    if record["found"]:
        last = record["record"]
        facts.add_row("Last record", f"{record['path']}: {last.get('time')}, {last.get('summary')}")
    elif record["path"] is None:  # the asked directory and the default one both refused
        facts.add_row("Last record", f"none: no record directory this user may read ({record['refused']})")
    else:
        why = f" ({record['error']})" if record["error"] else ""
        facts.add_row("Last record", f"none at {record['path']}{why}")
    console.print(facts)


def _libcuda_line(libcuda: dict[str, Any]) -> str:
    if not libcuda["path"]:
        skipped = f" (passed over: {'; '.join(libcuda['skipped'])})" if libcuda["skipped"] else ""
        return "not found" + skipped
    line = f"{libcuda['path']} (via {libcuda['how']})"
    if libcuda["overlay_of"]:
        line += f": tmaguard's overlay in front of {libcuda['overlay_of']}"
    else:
        line += f", SONAME {libcuda['soname']}"
    if libcuda["real_driver"]:
        line += f"; real driver beside it: {libcuda['real_driver']}"
    if libcuda["error"]:
        line += f"; unreadable: {libcuda['error']}"
    return line


def _consumers(console: Console, report: dict[str, Any]) -> None:
    from rich.text import Text

    known = report["libcuda"]["path"] is not None and not report["libcuda"]["error"]
    rows = [r for r in report["consumers"] if (r["needs"] and known) or r["error"]]
    if not rows:
        return
    _section(console, "Driver entry points by consumer")
    table = _table(
        ("consumer", {"no_wrap": True}),
        ("asks", {"overflow": "fold", "ratio": 2}),
        ("libcuda.so.1 lacks", {"overflow": "fold", "ratio": 4}),
        ("covered by", {"overflow": "fold", "ratio": 2}),
    )
    for r in rows:
        asks = "its own handle" if r["scope"] == "handle" else "global scope"
        if r["error"]:
            table.add_row(r["name"], asks, Text(f"unreadable: {r['error']}", style="red"), "")
            continue
        lacks = "?" if r["lacks"] is None else ", ".join(r["lacks"]) or "-"
        cover = ", ".join(sorted(set(r["coverage"].values()))) or "-"
        table.add_row(r["name"], asks, lacks, cover)
    console.print(table)


def _architectures(console: Console, report: dict[str, Any]) -> None:
    from rich.text import Text

    architectures = report["architectures"]
    if not architectures["extensions"]:
        return
    devices = architectures["devices"]
    _section(console, "GPU code in vLLM's extensions")
    table = _table(
        ("extension", {"no_wrap": True}),
        ("SASS", {"overflow": "fold", "ratio": 4}),
        ("PTX", {"overflow": "fold", "ratio": 3}),
        *((f"on {sm}", {"overflow": "fold", "ratio": 3}) for sm in devices),
    )
    for e in architectures["extensions"]:
        if e["error"]:
            table.add_row(
                e["module"], Text(f"unreadable: {e['error']}", style="red"), "", *["" for _ in devices]
            )
            continue
        cells = [_coverage_cell(e["coverage"][sm], e["fatbins"]) for sm in devices]
        table.add_row(e["module"], " ".join(e["sass"]) or "-", " ".join(e["ptx"]) or "-", *cells)
    console.print(table)


def _coverage_cell(coverage: dict[str, Any], fatbins: int) -> str:
    if coverage["verdict"] == "partial":
        return f"native in {coverage['native']} of {fatbins}" + (
            f", JIT {coverage['jit']}" if coverage["jit"] else ""
        )
    return {"jit": "PTX JIT only", "none": "none"}.get(coverage["verdict"], coverage["verdict"])


def _routing(console: Console, report: dict[str, Any]) -> None:
    routing = report["decision"].get("routing") or {}
    if not routing.get("families"):
        return
    _section(console, "Kernel routing (what the guard sets in vLLM processes)")
    plan = _grid(22)
    for family in routing["families"]:
        plan.add_row(family["family"], f"{family['path']} ({family['why']})")
    for key, value in (routing.get("env") or {}).items():
        plan.add_row("sets", f"{key}={value}")
    console.print(plan)


def _findings(console: Console, report: dict[str, Any]) -> None:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    _section(console, "Findings")
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
        findings.add_row(Text(finding["severity"].upper(), style=STYLE[finding["severity"]]), Group(*body))
    console.print(findings)


def _fix(console: Console, report: dict[str, Any]) -> None:
    fix = report["fix"]
    if not (fix["steps"] or fix["manifest"]):
        return
    _section(console, "Fix")
    steps = _grid(3)
    for number, step in enumerate(fix["steps"], 1):
        steps.add_row(f"{number}.", step)
    console.print(steps)
    if fix["manifest"]:
        console.print("In the manifests (deploy/k8s):")
        for line in fix["manifest"].splitlines():
            console.print("  " + line, overflow="fold")


def _summary(console: Console, report: dict[str, Any]) -> None:
    from rich.text import Text

    problems = sum(f["severity"] in PROBLEMS for f in report["findings"])
    console.print()
    summary = "healthy" if not problems else f"{problems} problem{'s' if problems > 1 else ''} found"
    style = "bold green" if not problems else "bold red"
    console.print(Text(f"{summary} (exit {report['exit_code']}), {report['elapsed_ms']} ms", style=style))
