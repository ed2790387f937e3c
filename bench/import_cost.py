"""What each of the package's modules costs to import in a guarded process (python -X importtime, the
module's own time, median over fresh processes), a pod's first process (the full run) and a later one (the
replay), with the standard library a vLLM process loads imported first (bench/guard_cost.py); and how much of
the first's goes to defining value types (typing.NamedTuple or stages/values.py) and compiling regular
expressions.

usage: python bench/import_cost.py [--runs N] [--pod KIND]   (in this process's environment, or an
       emulated pod of tests/podkit.py; inside a real one: bench/device/real_layers/pod.sh POD -- ...)"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from guard_cost import PRELOAD, stdlib_of_vllm
from replay_steps import _pod_env

MARK = "tmaguard-import-cost"
CHILD = PRELOAD + f"""
sys.stderr.write("{MARK}\\n")
import re, time, typing
spent = {{"NamedTuple classes": 0.0, "value types (values.py)": 0.0, "regular expressions compiled": 0.0}}
def timed(what, real):
    def call(*args, **kwargs):
        started = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[what] += (time.perf_counter() - started) * 1e3
    return call
typing.NamedTupleMeta.__new__ = timed("NamedTuple classes", typing.NamedTupleMeta.__new__)
re._compile = timed("regular expressions compiled", re._compile)
if sys.argv[2:] == ["first"]:  # a later process must not import the stages to be timed
    try:
        import vllm_tmaguard.stages.values as values
        values.value_type = timed("value types (values.py)", values.value_type)
    except ImportError:  # a build before it
        pass
from vllm_tmaguard.guard import activate
activate("bench")
print("RESULT " + json.dumps(spent))
"""


def one(env: dict[str, str], preload: str, which: str) -> tuple[dict[str, int], dict[str, float]]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", CHILD, preload, which], env=env, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    own: dict[str, int] = {}
    for line in done.stderr.split(MARK + "\n", 1)[1].splitlines():
        fields = line.removeprefix("import time:").split("|")
        if len(fields) == 3 and fields[0].strip().isdigit() and "vllm_tmaguard" in fields[2]:
            own[fields[2].strip()] = int(fields[0])
    result = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return own, json.loads(result.removeprefix("RESULT "))


def table(title: str, samples: list[tuple[dict[str, int], dict[str, float]]]) -> list[str]:
    modules = sorted({name for own, _ in samples for name in own})
    medians = {name: statistics.median(own.get(name, 0) for own, _ in samples) for name in modules}
    lines = [f"{title}: {len(modules)} modules, {sum(medians.values()) / 1e3:.2f} ms (sum of medians)"]
    lines += [f"  {us / 1e3:6.3f} ms  {name}" for name, us in sorted(medians.items(), key=lambda kv: -kv[1])]
    for what in samples[0][1]:
        lines.append(f"  of which {what}: {statistics.median(s[what] for _, s in samples):.2f} ms")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--pod", help="an emulated pod of tests/podkit.py instead of this environment")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as base:
        env = {**os.environ, **_pod_env(args.pod, base)}
        preload = json.dumps(stdlib_of_vllm({**env, "TMAGUARD_RECORD_DIR": os.path.join(base, "probe")}))
        records = [os.path.join(base, f"records-{run}") for run in range(args.runs)]
        firsts = [one({**env, "TMAGUARD_RECORD_DIR": record_dir}, preload, "first") for record_dir in records]
        warm = {**env, "TMAGUARD_RECORD_DIR": records[0]}
        laters = [one(warm, preload, "later") for _ in range(args.runs)]
    print("\n".join(table("a pod's first process", firsts) + table("a later process", laters)))


if __name__ == "__main__":
    main()
