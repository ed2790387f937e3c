"""The field layers' tables of docs/real-layers.md (issue 26), from field.sh's and serve.sh's results, and
their raw results under docs/device/field-layers/.

usage: python bench/device/real_layers/field_report.py FIELD-CHECKS.tgz [REAL-SERVE.tgz ...]
  Prints Markdown; writes docs/device/field-layers/checks.jsonl and serve-<n>/<pod>.json, one directory per
  serving call (each pod's summary without its server log's tail)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from report import members  # the issue-18 tables' script beside this one

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "docs/device/field-layers"
STEPS = ("quota", "torch", "cublaslt", "half", "triton", "triton_tma", "machete")
SERVED = {
    "a": "bare", "a2": "bare again", "fork": "vCUDA fork ec4dee1", "hv12": "HAMi-core 8c32de6",
    "vgm": "vgpu-manager 3d7f66d", "nvs": "nvshare 1a8f211 (graphs off)", "lup": "lupine 7fbd364 (fp32)",
    "a32": "bare, fp32",
}  # fmt: skip


def cell(result: dict) -> str:
    if not result.get("ok"):
        why = result.get("error") or f"exit {result.get('exit')}"
        return f"FAILED ({why.splitlines()[0][:48]})"
    if "mem_get_info_gib" in result:
        refused = "refused" if result.get("alloc_10_gib_refused") else "allowed"
        return f"{result['mem_get_info_gib'][1]:g} GiB shown, 10 GiB {refused}"
    error = result.get("rel_error")
    if isinstance(error, dict):
        return "ok (" + ", ".join(f"{v:.1e}" for v in error.values()) + ")"
    return f"ok ({error:.1e})" if error is not None else "ok"


def checks_table(rows: list[dict]) -> list[str]:
    lines = ["| pod | process | " + " | ".join(STEPS) + " |", "|---|---|" + "---|" * len(STEPS)]
    for pod in dict.fromkeys(row["pod"] for row in rows):
        for with_vllm in (False, True):
            found = {
                row["result"].get("step"): row["result"]
                for row in rows
                if row["pod"] == pod and bool(row["result"].get("vllm")) == with_vllm and not row["vars"]
            }
            if not any(step in found for step in STEPS):
                continue
            cells = [cell(found[step]) if step in found else "-" for step in STEPS]
            lines.append(f"| {pod} | {'import vllm' if with_vllm else 'torch only'} | {' | '.join(cells)} |")
    return lines


def serve_table(files: dict[str, bytes], run: int) -> list[str]:
    summaries = {
        name.split("/")[1]: json.loads(data)
        for name, data in files.items()
        if name.endswith("/summary.json") and name.count("/") == 2
    }
    target = OUT / f"serve-{run}"
    target.mkdir(parents=True, exist_ok=True)
    for pod, summary in summaries.items():
        kept = {k: v for k, v in summary.items() if k != "log_tail"}
        (target / f"{pod}.json").write_text(json.dumps(kept, indent=1))
    reference = [o["token_ids"] for o in summaries.get("a", {}).get("outputs") or []]
    bare = summaries.get("a", {}).get("bench", {})
    lines = [
        "| pod | ready (s) | EngineCore's device | tokens identical to bare | output tok/s c=1 / 8 / 64 "
        "| ratio to bare |",
        "|---|---|---|---|---|---|",
    ]
    for pod, name in SERVED.items():
        summary = summaries.get(pod)
        if summary is None:
            continue
        freed = [line for line in summary["log_lines"] if "Initial free memory" in line]
        memory = freed[0].split("Initial free memory")[1].split(",")[0].strip() if freed else "-"
        outputs = [o["token_ids"] for o in summary.get("outputs") or []]
        same = f"{sum(o == r for o, r in zip(outputs, reference, strict=False))} of {len(outputs)}"
        bench = summary.get("bench", {})
        tok_s = " / ".join(
            ",".join(str(round(r.get("output_throughput") or 0)) for r in bench.get(c, [])) or "-"
            for c in ("1", "8", "64")
        )
        ratios = []
        for c in ("1", "8", "64"):
            mine = [r["output_throughput"] for r in bench.get(c, []) if r.get("output_throughput")]
            base = [r["output_throughput"] for r in bare.get(c, []) if r.get("output_throughput")]
            ratios.append(
                f"{statistics.median(mine) / statistics.median(base):.2f}" if mine and base else "-"
            )
        ready = (
            f"{summary['ready_s']:.0f}"
            if summary.get("ready_s")
            else f"failed (exit {summary.get('exit_code')})"
        )
        lines.append(f"| {name} | {ready} | {memory} free | {same} | {tok_s} | {' / '.join(ratios)} |")
    return lines


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    files = members(Path(sys.argv[1]))
    rows = [json.loads(line) for line in files["field/checks.jsonl"].decode().splitlines()]
    (OUT / "checks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    print("\n".join(checks_table(rows)))
    for run, archive in enumerate(sys.argv[2:], start=1):
        print()
        print("\n".join(serve_table(members(Path(archive)), run)))


if __name__ == "__main__":
    main()
