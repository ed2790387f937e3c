"""The tables of docs/real-layers.md from the real-layer device calls, and their raw results under
docs/device/real-layers/.

usage: python bench/device/real_layers/report.py CHECKS.tgz SERVE.tgz [SERVE.tgz ...]
  CHECKS.tgz: run.sh's real-checks.tgz; SERVE.tgz: serve.sh's real-serve.tgz, one per call (each call's ratios
  compare its own pods only). Prints Markdown; writes docs/device/real-layers/checks.jsonl and
  serve-<n>/<pod>.json (the summary without the server's log tail)."""

from __future__ import annotations

import json
import statistics
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "docs/device/real-layers"
POD_NAMES = {
    "a": "bare",
    "a2": "bare again",
    "vm": "vCUDA master",
    "v105": "vCUDA v1.0.5",
    "hami": "HAMi-core",
}
STEPS = ("quota", "torch", "cublaslt", "triton", "triton_tma", "machete")
SOURCES = {0: "-", 3: "real driver", 4: "layer", 5: "tmaguard"}


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def checks_table(files: dict[str, bytes]) -> list[str]:
    rows = [json.loads(line) for line in files["results/checks.jsonl"].decode().splitlines()]
    (OUT / "checks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    lines = ["| pod | process | " + " | ".join(STEPS) + " |", "|---|---|" + "---|" * len(STEPS)]
    for pod in ("bare", "vcuda-master", "vcuda-v1.0.5", "hami"):
        for with_vllm in (False, True):
            cells = []
            for step in STEPS:
                found = [
                    r["result"]
                    for r in rows
                    if r["pod"] == pod
                    and r["result"].get("step") == step
                    and bool(r["result"].get("vllm")) == with_vllm
                    and "MODE=off" not in r["vars"]
                ]
                cells.append(_cell(found[0]) if found else "-")
            lines.append(
                f"| {pod} | {'import vllm' if with_vllm else 'torch only'} | " + " | ".join(cells) + " |"
            )
    return lines


def _cell(result: dict) -> str:
    if not result.get("ok"):
        return f"FAILED ({result.get('exit', result.get('error', '?'))})"[:60]
    if "mem_get_info_gib" in result:
        total = result["mem_get_info_gib"][1]
        refused = result.get("alloc_10_gib_refused")
        return f"{total:g} GiB shown, 10 GiB {'refused' if refused else 'allowed'}"
    if "rel_error" in result:
        return f"ok ({result['rel_error']:.1e})"
    return "ok"


def serve_tables(run: int, files: dict[str, bytes]) -> list[str]:
    summaries = {
        name.split("/")[1]: json.loads(data)
        for name, data in files.items()
        if name.endswith("/summary.json") and name.count("/") == 2
    }
    target = OUT / f"serve-{run}"
    target.mkdir(parents=True, exist_ok=True)
    for pod, summary in summaries.items():
        (target / f"{pod}.json").write_text(
            json.dumps({k: v for k, v in summary.items() if k != "log_tail"}, indent=1)
        )
    reference = summaries.get("a", {}).get("outputs") or []
    lines = [
        f"Call {run}:",
        "",
        "| pod | ready (s) | KV cache | completions token-identical to bare | records "
        "| output tok/s c=1 / 8 / 64 (per round) |",
        "|---|---|---|---|---|---|",
    ]
    for pod in ("a", "a2", "vm", "v105", "hami"):
        summary = summaries.get(pod)
        if summary is None:
            continue
        kv = next(
            (
                line.split("]")[-1].strip()
                for line in summary["log_lines"]
                if "KV cache memory" in line or ("reserved" in line and "KV Cache" in line)
            ),
            "-",
        )
        outputs = summary.get("outputs") or []
        same = sum(o["token_ids"] == r["token_ids"] for o, r in zip(outputs, reference, strict=False))
        tok_s = " / ".join(
            ",".join(str(round(r.get("output_throughput") or 0)) for r in summary.get("bench", {}).get(c, []))
            for c in ("1", "8", "64")
        )
        ready = (
            f"{summary['ready_s']:.0f}"
            if summary.get("ready_s")
            else f"failed (exit {summary.get('exit_code')})"
        )
        records = len(summary["records"])
        same_of = f"{same} of {len(outputs)}"
        lines.append(f"| {POD_NAMES[pod]} | {ready} | {kv[:60]} | {same_of} | {records} | {tok_s} |")
    lines += ["", "Ratio of medians against bare (output tok/s):", ""]
    bare = summaries.get("a", {}).get("bench", {})
    for pod in ("a2", "vm", "v105", "hami"):
        bench = summaries.get(pod, {}).get("bench", {})
        ratios = []
        for c in ("1", "8", "64"):
            mine = [r["output_throughput"] for r in bench.get(c, []) if r.get("output_throughput")]
            base = [r["output_throughput"] for r in bare.get(c, []) if r.get("output_throughput")]
            ratios.append(
                f"{statistics.median(mine) / statistics.median(base):.2f}" if mine and base else "-"
            )
        lines.append(f"- {POD_NAMES[pod]}: " + " / ".join(ratios))
    return lines


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    print("\n".join(checks_table(members(Path(sys.argv[1])))))
    for run, archive in enumerate(sys.argv[2:], start=1):
        print()
        print("\n".join(serve_tables(run, members(Path(archive)))))


if __name__ == "__main__":
    main()
