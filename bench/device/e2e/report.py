"""Tables and the plot of docs/e2e-on-hopper.md from the end-to-end run's results (serve_pods.py's
summary.json per pod, as the device call returned them), and the raw summaries under docs/device/e2e/.

usage: python bench/device/e2e/report.py RUN_DIR [RUN_DIR ...]   (one per device call, each holding that
call's results/; every ratio compares pods of one call, side by side; prints the tables as Markdown; writes
docs/device/e2e/<run>/<pod>.json, <run> being RUN_DIR's name, and docs/img/e2e_throughput.png)"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ORDER = ("a", "b", "c", "d", "e-latency", "e-portable", "a2")
KERNEL = re.compile(r"Using (\w+) for AutoGPTQLinearMethod|Using FlashAttention version (\d)")


ROLE = re.compile(r"^\((\w+) pid=(\d+)\)")


def roles(server_log: Path) -> dict[str, str]:
    """pid -> the vLLM process it is (APIServer, EngineCore, ...), from the prefixes of the server's log."""
    found: dict[str, str] = {}
    for line in server_log.read_text(errors="replace").splitlines() if server_log.exists() else ():
        match = ROLE.match(line)
        if match and match.group(1) != "tmaguard":
            found.setdefault(match.group(2), match.group(1))
    return found


def load(run: Path) -> dict[str, dict]:
    results = run / "results" if (run / "results").is_dir() else run
    pods = {}
    for name in ORDER:
        path = results / name / "summary.json"
        if path.exists():
            pods[name] = json.loads(path.read_text())
            pods[name].setdefault("roles", roles(results / name / "server.log"))
    return pods


def bench_value(pod: dict, concurrency: str, field: str) -> float | None:
    runs = [r.get(field) for r in pod.get("bench", {}).get(concurrency, []) if r.get(field) is not None]
    return statistics.median(runs) if runs else None


def kernels(pod: dict) -> str:
    gemm, attention = "?", "?"
    for line in pod.get("log_lines", []):
        match = KERNEL.search(line)
        if match and match.group(1):
            gemm = match.group(1).removesuffix("LinearKernel")
        elif match:
            attention = f"FA{match.group(2)}"
    return f"{gemm} + {attention}"


def mismatches(pod: dict, reference: dict) -> str:
    ours, theirs = pod.get("outputs"), reference.get("outputs")
    if not ours or not theirs:
        return "-"
    differ = sum(a["token_ids"] != b["token_ids"] for a, b in zip(ours, theirs, strict=True))
    tokens = sum(
        sum(x != y for x, y in zip(a["token_ids"], b["token_ids"], strict=True))
        for a, b in zip(ours, theirs, strict=True)
    )
    return f"{differ}/{len(ours)} prompts ({tokens} of {64 * len(ours)} tokens)"


def outcome(pod: dict) -> str:
    if pod.get("ready_s") is not None:
        return "served"
    errors = [line for line in pod.get("log_tail", []) if "Error" in line or "undefined symbol" in line]
    return f"failed (exit {pod.get('exit_code')}): `{errors[-1].strip()[:200]}`" if errors else "failed"


def runs_count(pod: dict, concurrency: str) -> int:
    return sum(r.get("output_throughput") is not None for r in pod.get("bench", {}).get(concurrency, []))


def tables(runs: dict[str, dict[str, dict]]) -> list[str]:
    lines = [
        "| run | pod | what | ready (s) | outcome | W4A16 GEMM + attention | outputs vs the run's a |",
        "|---|---|---|---|---|---|---|",
    ]
    for run, pods in runs.items():
        for name, pod in pods.items():
            ready = f"{pod['ready_s']:.1f}" if pod.get("ready_s") else "-"
            versus = mismatches(pod, pods["a"]) if name != "a" and "a" in pods else "-"
            lines.append(
                f"| {run} | {name} | {pod['what']} | {ready} | {outcome(pod)} | {kernels(pod)} | {versus} |"
            )
    lines += [
        "",
        "| run | pod | concurrency | runs | output tok/s | vs the run's a | median TTFT (ms) "
        "| median TPOT (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run, pods in runs.items():
        for name, pod in pods.items():
            for concurrency in ("1", "8", "64"):
                tok = bench_value(pod, concurrency, "output_throughput")
                if tok is None:
                    continue
                base = bench_value(pods["a"], concurrency, "output_throughput") if "a" in pods else None
                ratio = f"{tok / base:.3f}" if base else "-"
                ttft = bench_value(pod, concurrency, "median_ttft_ms")
                tpot = bench_value(pod, concurrency, "median_tpot_ms")
                count = runs_count(pod, concurrency)
                lines.append(
                    f"| {run} | {name} | {concurrency} | {count} | {tok:.0f} | {ratio} | {ttft:.1f} "
                    f"| {tpot:.2f} |"
                )
    return lines


def records(runs: dict[str, dict[str, dict]]) -> list[str]:
    lines = ["| run | pod | pid | process | guard ms | summary |", "|---|---|---|---|---|---|"]
    for run, pods in runs.items():
        for name, pod in pods.items():
            for record in pod.get("records", []):
                role = pod["roles"].get(str(record["pid"]), "helper (no log line)")
                lines.append(
                    f"| {run} | {name} | {record['pid']} | {role} | {record['elapsed_ms']} "
                    f"| {record['summary']} |"
                )
    return lines


def plot(runs: dict[str, dict[str, dict]], path: Path) -> None:
    """One panel per run that measured more than one concurrency: only pods of one run share a scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def points(pod: dict) -> list[tuple[int, float]]:
        values = [(int(c), bench_value(pod, c, "output_throughput")) for c in ("1", "8", "64")]
        return [(c, v) for c, v in values if v is not None]

    panels = {run: pods for run, pods in runs.items() if any(len(points(p)) > 1 for p in pods.values())}
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), sharey=True, squeeze=False)
    for axis, (run, pods) in zip(axes[0], panels.items(), strict=True):
        for name, pod in pods.items():
            if len(points(pod)) > 1:
                axis.plot(*zip(*points(pod), strict=True), marker="o", label=f"{name}: {kernels(pod)}")
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xticks([1, 8, 64], ["1", "8", "64"])
        axis.set_xlabel("concurrency (requests in flight)")
        axis.set_title(f"{run}: {', '.join(pods)}", fontsize=9)
        axis.legend(fontsize=7)
        axis.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("output tokens/s (median of rounds)")
    figure.suptitle("vllm serve on an H100, vLLM 0.25.1, W4A16 GPTQ (Llama-2-7B layer shapes)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    runs = {Path(arg).name: load(Path(arg)) for arg in sys.argv[1:]}
    for run, pods in runs.items():
        raw = ROOT / "docs/device/e2e" / run
        raw.mkdir(parents=True, exist_ok=True)
        for name, pod in pods.items():
            (raw / f"{name}.json").write_text(json.dumps(pod, indent=1))
    plot(runs, ROOT / "docs/img/e2e_throughput.png")
    print("\n".join([*tables(runs), "", *records(runs)]))


if __name__ == "__main__":
    main()
