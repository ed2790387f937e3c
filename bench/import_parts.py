"""Where a later process's import time goes, module by module (the replay's modules, docs/benchmarks.md):
the finder, `get_code` (the byte code read and unmarshalled), the module object made, the module executed,
each timed around importlib's own steps in a fresh process that has the standard library a vLLM process
loads imported first (bench/guard_cost.py); median µs over fresh processes, with each module's byte-code size.

usage: python bench/import_parts.py [--runs N]
       (inside a real pod: bench/device/real_layers/pod.sh POD -- ...)"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from guard_cost import PRELOAD, stdlib_of_vllm

REPLAY_MODULES = ("codes", "files", "issue", "process", "verdict", "guard")  # in the order guard imports them
CHILD = PRELOAD + f"""
import importlib.util, marshal
import vllm_tmaguard
rows = []
for name in {REPLAY_MODULES!r}:
    full = "vllm_tmaguard." + name
    t0 = time.perf_counter(); spec = importlib.util.find_spec(full)
    t1 = time.perf_counter(); code = spec.loader.get_code(full)
    t2 = time.perf_counter(); module = importlib.util.module_from_spec(spec); sys.modules[full] = module
    t3 = time.perf_counter(); exec(code, module.__dict__)
    t4 = time.perf_counter()
    times = [(t1 - t0) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6, (t4 - t3) * 1e6]
    rows.append([*times, len(marshal.dumps(code))])
print("RESULT " + json.dumps(rows))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    env = dict(os.environ)
    preload = json.dumps(stdlib_of_vllm(env))
    runs = []
    for _ in range(args.runs):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, preload], env=env, check=True, capture_output=True, text=True
        )
        runs.append(json.loads(next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))[7:]))
    print(f"Python {sys.version.split()[0]}; median µs of {args.runs} fresh processes")
    print("| module | find | get_code | module object | exec | byte code (KB) |\n|---|---|---|---|---|---|")
    for index, name in enumerate(REPLAY_MODULES):
        parts = [statistics.median(run[index][part] for run in runs) for part in range(4)]
        size = runs[0][index][4] / 1000
        print(f"| {name} | " + " | ".join(f"{p:.0f}" for p in parts) + f" | {size:.1f} |")


if __name__ == "__main__":
    main()
