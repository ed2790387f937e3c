"""Where a pod's first process spends its time (the full run: every stage, cold caches), by function: cProfile
over a fresh process that has imported the standard library a vLLM process loads (bench/guard_cost.py),
the profile's own overhead included, so read the shares, not the milliseconds. The runs' profiles are
summed; printed: the functions with the most time of their own, and the package's with the most in all.

usage: python bench/full_run_profile.py [--runs N] [--pod KIND]   (in this process's environment, or an
       emulated pod of tests/podkit.py; inside a real one: bench/device/real_layers/pod.sh POD -- ...)"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from guard_cost import PRELOAD, stdlib_of_vllm
from replay_steps import _pod_env

CHILD = PRELOAD + """
import cProfile
profile = cProfile.Profile()
profile.enable()
from vllm_tmaguard.guard import activate
activate("bench")
profile.disable()
profile.dump_stats(sys.argv[2])
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--pod", help="an emulated pod of tests/podkit.py instead of this environment")
    args = parser.parse_args()
    import pstats

    total: pstats.Stats | None = None
    with tempfile.TemporaryDirectory() as base:
        env = {**os.environ, **_pod_env(args.pod, base)}
        preload = json.dumps(stdlib_of_vllm({**env, "TMAGUARD_RECORD_DIR": os.path.join(base, "probe")}))
        for run in range(args.runs):
            child_env = {**env, "TMAGUARD_RECORD_DIR": os.path.join(base, f"records-{run}")}
            path = os.path.join(base, f"profile-{run}")
            subprocess.run(
                [sys.executable, "-c", CHILD, preload, path], env=child_env, capture_output=True, check=True
            )
            total = pstats.Stats(path) if total is None else total.add(path)
    assert total is not None
    rows = total.stats.items()  # type: ignore[attr-defined]
    print(f"{args.runs} first processes; ms summed over them (profiled)")
    print("most time of their own:")
    for (file, line, name), (_, calls, own, _, _) in sorted(rows, key=lambda kv: -kv[1][2])[:25]:
        print(f"  {own * 1e3:8.2f} {calls:7d}  {os.path.basename(file)}:{line}:{name}")
    print("the package's functions, most time in all:")
    ours = [(key, value) for key, value in rows if "vllm_tmaguard" in key[0]]
    for (file, line, name), (_, calls, _, inclusive, _) in sorted(ours, key=lambda kv: -kv[1][3])[:25]:
        print(f"  {inclusive * 1e3:8.2f} {calls:7d}  {os.path.basename(file)}:{line}:{name}")


if __name__ == "__main__":
    main()
