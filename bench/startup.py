"""What the guard costs a vLLM process at start-up, measured side by side in one run: fresh processes that
import vLLM 0.32.0 and resolve its current platform (which imports the CUDA extension), with the guard and
with TMAGUARD_MODE=off, interleaved, on an emulated vCUDA pod and on this machine as it is (no GPU). The
guard's own time comes from its record (elapsed_ms: probes, decision, loading, record), which excludes
noise from the rest of the process; the wall-clock difference is reported beside it.
Targets: the guard <= 5 ms and <= 0.5% of vLLM's own start-up.

usage: .venv/bin/python bench/startup.py [--runs N]"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_section
from podkit import build_pod, scrubbed_environ

CHILD = "from vllm.platforms import current_platform; current_platform.get_device_name"


def one_run(env: dict[str, str], record_dir: str) -> tuple[float, float | None]:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", CHILD],
        env={**env, "TMAGUARD_RECORD_DIR": record_dir},
        check=True,
        capture_output=True,
    )
    wall_ms = (time.perf_counter() - started) * 1e3
    try:
        with open(os.path.join(record_dir, "last.json")) as file:
            guard_ms = json.load(file)["elapsed_ms"]
        os.remove(os.path.join(record_dir, "last.json"))
    except FileNotFoundError:
        guard_ms = None
    return wall_ms, guard_ms


def measure(name: str, env: dict[str, str], runs: int, compare: bool = True) -> dict[str, float | str]:
    """Medians: wall time with the guard, without it (where vLLM starts without it), the guard's own time."""
    with tempfile.TemporaryDirectory() as records:
        one_run(env, records)  # warm the page cache and the guard's scan cache, as a pod's second process
        on, off, own = [], [], []
        for index in range(runs):
            order = [("on", env)] + ([("off", {**env, "TMAGUARD_MODE": "off"})] if compare else [])
            for label, run_env in order if index % 2 == 0 else reversed(order):
                wall, guard = one_run(run_env, records)
                (on if label == "on" else off).append(wall)
                if guard is not None:
                    own.append(guard)
    nan = float("nan")
    return {
        "setting": name,
        "with": statistics.median(on),
        "without": statistics.median(off) if off else nan,
        "guard": statistics.median(own) if own else nan,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=12)
    args = parser.parse_args()
    base_env = scrubbed_environ()
    with tempfile.TemporaryDirectory() as base:
        vcuda, bare = build_pod(Path(base), "vcuda"), build_pod(Path(base), "bare")
        rows = [
            measure("emulated bare-metal pod (nothing to load)", {**base_env, **bare.env}, args.runs),
            measure("this machine, no GPU (guard quiet)", base_env, args.runs),
            # Without the guard vLLM cannot start here: its own time against vLLM's whole start-up.
            measure(
                "emulated vCUDA pod (overlay loaded)", {**base_env, **vcuda.env}, args.runs, compare=False
            ),
        ]
    lines = [
        "## Start-up: the guard's cost in a vLLM process",
        "",
        f"Command: `.venv/bin/python bench/startup.py --runs {args.runs}`: fresh processes importing vLLM "
        "0.32.0 and resolving its platform, with the guard and with TMAGUARD_MODE=off, interleaved; medians. "
        "'guard' is the guard's own elapsed_ms from its record (warm scan cache, as in every process "
        "after a pod's first). On the vCUDA pod vLLM cannot start without the guard: the share is of the "
        "rest of the start-up.",
        "",
        "| setting | wall with guard ms | wall without ms | guard's own ms | guard / vLLM start-up |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        vllm_own = row["without"] if row["without"] == row["without"] else row["with"] - row["guard"]
        without = f"{row['without']:.0f}" if row["without"] == row["without"] else "(cannot start)"
        lines.append(
            f"| {row['setting']} | {row['with']:.0f} | {without} | {row['guard']:.2f} | "
            f"{row['guard'] / vllm_own * 100:.2f}% |"
        )
    lines += [
        "",
        "Targets: <= 5 ms and <= 0.5% of vLLM's own start-up. The wall-clock difference includes "
        "this machine's noise (2 shared cores); the record's figure is the guard's own work.",
        "",
    ]
    print("\n".join(lines))
    write_section(str(Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"), lines)


if __name__ == "__main__":
    main()
