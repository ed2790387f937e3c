"""Where a replay's time goes (the verdict cache, vllm_tmaguard/verdict.py), step by step, in this process's
environment: a first process fills TMAGUARD_RECORD_DIR, then fresh processes, each with the standard library
a vLLM process loads already imported (bench/guard_cost.py), time each step of verdict.replay.

usage: python bench/replay_steps.py [--runs N]   (inside a pod: bench/device/real_layers/pod.sh POD -- ...;
       an emulated one: `python bench/replay_steps.py --pod vcuda`)"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from guard_cost import PRELOAD, stdlib_of_vllm

CHILD = PRELOAD + """
times, last = {}, time.perf_counter()
def lap(step):
    global last
    now = time.perf_counter()
    times[step] = (now - last) * 1e3
    last = now
import vllm_tmaguard.guard
from vllm_tmaguard import issue, loaded, process, verdict as v
lap("import")
directory = v.replay_directory(); lap("record directory")
entries = v.load_entries(directory); lap("cache file")
stored = entries[0]["process"]
loaded.read_loaded_objects(); lap("loaded objects")
process.find_package_dir("vllm"); lap("vllm's package")
v.observe_process(stored["library"], stored["env_names"], stored["env_prefixes"]); lap("process inputs")
entry = v._matching(entries); lap("file inputs")
v._replayable_here(entry, v._issuable(entry["record"])); lap("record checked, trust, secrets, imports")
v.redo(entry["redo"]); lap("changes")
document = v.for_process(entry["record"], "steps"); lap("record")
issue.write_record(document, directory); lap("record file")
issue.announce(document, entry["log_format"]); lap("log line")
print("RESULT " + json.dumps(times))
"""


def _pod_env(kind: str | None, base: str) -> dict[str, str]:
    if kind is None:
        return {}
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from pathlib import Path

    from podkit import build_pod, scrubbed_environ

    return {**scrubbed_environ(), **build_pod(Path(base) / "pods", kind, cc="9.0").env}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--pod", help="an emulated pod of tests/podkit.py instead of this environment")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as records:
        env = {**os.environ, "TMAGUARD_RECORD_DIR": records, **_pod_env(args.pod, records)}
        preload = json.dumps(stdlib_of_vllm(env))
        subprocess.run([sys.executable, "-c", "from vllm_tmaguard.guard import activate; activate('fill')"],
                       env=env, check=True, capture_output=True)  # fmt: skip
        runs = []
        for _ in range(args.runs):
            done = subprocess.run(
                [sys.executable, "-c", CHILD, preload], env=env, check=True, capture_output=True, text=True
            )
            line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
            runs.append(json.loads(line.removeprefix("RESULT ")))
    medians = {step: statistics.median(r[step] for r in runs) for step in runs[0]}
    for step, median in medians.items():
        print(f"{step:20s} {median:7.3f} ms")
    print(f"{'sum of the medians':20s} {sum(medians.values()):7.3f} ms")


if __name__ == "__main__":
    main()
