"""The field layers' tables of docs/real-layers.md (issue 26), from field.sh's and serve.sh's results, and
their raw results under docs/device/field-layers/.

usage: python bench/device/real_layers/field_report.py [--first N] [FIELD-CHECKS.tgz] [REAL-SERVE.tgz ...]
  Prints Markdown; writes docs/device/field-layers/checks.jsonl and serve-<n>/<pod>.json, one directory per
  serving call (each pod's summary without its server log's tail), n counting from N (default 1); a serving
  call run with E2E_PROBE=1 also gets the table of what each process with a CUDA context was shown."""

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
    "a32": "bare, fp32", "fork-whole": "vCUDA fork ec4dee1, whole GPUs",
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
            ",".join(str(round(r["output_throughput"])) for r in bench.get(c, []) if "output_throughput" in r)
            or "-"
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


def divergence_table(files: dict[str, bytes]) -> list[str]:
    """With E2E_LOGPROBS: for each pod against bare, the largest logprob difference on the tokens both chose
    alike (a wrong number shows here), and bare's margin between its top two where they first part (a near
    tie: within the half-precision rounding step)."""
    summaries = {
        name.split("/")[1]: json.loads(data)
        for name, data in files.items()
        if name.endswith("/summary.json") and name.count("/") == 2
    }
    reference = summaries.get("a", {}).get("outputs") or []
    if not reference or "logprobs" not in reference[0]:
        return []
    lines = [
        "| pod | identical to bare | largest logprob difference before parting | bare's top-two margin where "
        "they part |",
        "|---|---|---|---|",
    ]
    for pod, name in SERVED.items():
        outputs = summaries.get(pod, {}).get("outputs") or []
        if pod == "a" or not outputs:
            continue
        prefix_gaps, margins = [0.0], []
        for mine, bare in zip(outputs, reference, strict=False):
            pairs = list(zip(mine["token_ids"], bare["token_ids"], strict=True))
            part = next((i for i, (x, y) in enumerate(pairs) if x != y), len(pairs))
            chosen = zip(mine["logprobs"][:part], bare["logprobs"][:part], strict=True)
            prefix_gaps += [abs(x - y) for x, y in chosen]
            if part < len(pairs):
                margins.append(bare["top"][part][0] - bare["top"][part][1])
        same = sum(m["token_ids"] == b["token_ids"] for m, b in zip(outputs, reference, strict=False))
        where = ", ".join(f"{m:.1e}" for m in margins) or "-"
        lines.append(f"| {name} | {same} of {len(outputs)} | {max(prefix_gaps):.1e} | {where} |")
    return lines


def probe_table(files: dict[str, bytes]) -> list[str]:
    """Each process with a CUDA context (E2E_PROBE=1): what cudaMemGetInfo showed it, and whether an
    allocation past the layer's limit was refused."""
    lines = ["| pod | process | device | cudaMemGetInfo total / free | past the limit |", "|" + "---|" * 5]
    for name, data in sorted(files.items()):
        if not (name.endswith("/summary.json") and name.count("/") == 2):
            continue
        pod = name.split("/")[1]
        for result in json.loads(data).get("probe") or []:
            if not result.get("cuda"):
                continue
            total, free, asked = (result[k] / 2**30 for k in ("total", "free", "asked"))
            lines.append(
                f"| {SERVED.get(pod, pod)} | {result.get('title')} | cuda:{result['device']} "
                f"| {total:.2f} / {free:.2f} GiB | {asked:.0f} GiB more: {result.get('past_limit')} |"
            )
    return lines if len(lines) > 2 else []


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    arguments = sys.argv[1:]
    first = 1
    if arguments[:1] == ["--first"]:
        first, arguments = int(arguments[1]), arguments[2:]
    archives = [members(Path(archive)) for archive in arguments]
    if archives and "field/checks.jsonl" in archives[0]:
        files = archives.pop(0)
        rows = [json.loads(line) for line in files["field/checks.jsonl"].decode().splitlines()]
        (OUT / "checks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        print("\n".join(checks_table(rows)))
    for run, files in enumerate(archives, start=first):
        print()
        print("\n".join(serve_table(files, run)))
        for table in (divergence_table(files), probe_table(files)):
            if table:
                print()
                print("\n".join(table))


if __name__ == "__main__":
    main()
