"""vLLM's own serving benchmark (the code behind `vllm bench serve`) for every pod, from one client process:
vLLM is imported once instead of once per run. The schedule interleaves the pods (each concurrency runs on
every pod before the next one, ROUNDS times), so that drift over the run falls on every pod alike.

usage: python bench_client.py PLAN.json   (serve_pods.py writes the plan: the pods' names, ports and result
directories, the model, the concurrencies with their prompt counts, the rounds and a wall-clock deadline
after which no run starts). Writes each run's vLLM result file into its pod's directory and, after every
run, the summary of all runs to the plan's "results" path."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from vllm.benchmarks.serve import add_cli_args
from vllm.benchmarks.serve import main as run_benchmark
from vllm.utils.argparse_utils import FlexibleArgumentParser

INPUT_LEN, OUTPUT_LEN = 512, 128
FIELDS = (
    "completed", "duration", "output_throughput", "request_throughput",
    "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_ttft_ms", "p99_tpot_ms",
)  # fmt: skip


def arguments(pod: dict, model: str, concurrency: int, prompts: int, round_: int, name: str) -> list[str]:
    """Random dataset, fixed lengths; the seed is the round, so every pod gets the same requests."""
    return [
        "--backend", "vllm", "--base-url", f"http://127.0.0.1:{pod['port']}", "--model", "tiny",
        "--tokenizer", model, "--dataset-name", "random",
        "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
        "--ignore-eos", "--seed", str(round_), "--num-warmups", str(min(concurrency, 8)), "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", pod["out"], "--result-filename", name,
    ]  # fmt: skip


def one_run(parser: FlexibleArgumentParser, pod: dict, plan: dict, concurrency: int, round_: int) -> dict:
    name = f"bench-c{concurrency}-r{round_}.json"
    prompts = plan["concurrency"][str(concurrency)]
    try:
        run_benchmark(parser.parse_args(arguments(pod, plan["model"], concurrency, prompts, round_, name)))
    except Exception as error:  # a failing run is a result; the other pods' runs go on
        return {"error": f"{type(error).__name__}: {error}"}
    raw = json.loads((Path(pod["out"]) / name).read_text())
    return {key: raw.get(key) for key in FIELDS}


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    results: dict[str, dict[str, list[dict]]] = {pod["name"]: {} for pod in plan["pods"]}
    for round_ in range(plan["rounds"]):
        for concurrency in plan["concurrency"]:
            for pod in plan["pods"]:
                if time.time() > plan["deadline"]:  # leave time to stop the servers and return results
                    result = {"error": "skipped: the call's time budget was spent"}
                else:
                    result = one_run(parser, pod, plan, int(concurrency), round_)
                results[pod["name"]].setdefault(concurrency, []).append(result)
                Path(plan["results"]).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
