"""What the import hook adds to `import torch` now that it also watches torch (torch maps libcuda.so.1, so
where the layer lacks entry points the guard must run before it). Fresh processes, alternating order, in an
emulated pod with a complete driver (the hook only asks its question: vLLM installed? libcuda.so.1 lacking
anything?) and in a vCUDA pod (the guard runs at torch's import instead of vLLM's). Writes a section of
docs/benchmarks.md.

usage: .venv/bin/python bench/torch_import.py"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _results import write_section
from podkit import build_pod, child_environ

RUNS = 20
CHILD = """
import json, sys, time
import vllm_tmaguard._import_hook as hook
if sys.argv[1] == "disarmed":
    hook.disarm()
start = time.perf_counter_ns()
import torch
elapsed = time.perf_counter_ns() - start
print(json.dumps([elapsed / 1e6, "vllm_tmaguard.guard" in sys.modules]))
"""


def measure(pod_kind: str, base: Path) -> dict[str, list[float]]:
    pod = build_pod(base, pod_kind)
    env = child_environ(pod, base / "records")
    times: dict[str, list[float]] = {"armed": [], "disarmed": []}
    for run in range(RUNS):
        for mode in ("armed", "disarmed") if run % 2 else ("disarmed", "armed"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, check=True
            ).stdout
            elapsed, guarded = json.loads(out.splitlines()[-1])
            assert guarded == (mode == "armed" and pod_kind != "bare"), (pod_kind, mode, out)
            times[mode].append(elapsed)
    return times


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as base:
        pods = (("bare", "complete driver: the question only"), ("vcuda", "vCUDA: the guard runs"))
        for kind, what in pods:
            times = measure(kind, Path(base))
            added = [a - d for a, d in zip(times["armed"], times["disarmed"], strict=True)]
            rows.append(
                f"| {what} | {statistics.median(times['disarmed']):.0f} | "
                f"{statistics.median(times['armed']):.0f} | **{statistics.median(added):+.1f}** |"
            )
    lines = [
        "## `import torch` before vLLM: what the hook adds",
        "",
        f"Command: `.venv/bin/python bench/torch_import.py` ({RUNS} fresh processes per row and mode, "
        "alternating order; CPU machine, torch 2.13 CUDA build, emulated pods).",
        "",
        "| pod | import torch, hook disarmed (ms) | hook armed (ms) | added (median of pairs, ms) |",
        "|---|---|---|---|",
        *rows,
        "",
    ]
    print("\n".join(lines))
    write_section("docs/benchmarks.md", lines)


if __name__ == "__main__":
    main()
