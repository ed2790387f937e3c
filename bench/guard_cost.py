"""What the guard costs each vLLM process (API server, EngineCore, every worker): the package's import plus
one activation, in a fresh process that has already imported the standard-library modules a vLLM process
loads anyway (read from a real `import vllm` with the guard off). Issue 19's targets: <= 10 ms per process
on a GPU host, import included; <= 3 ms where nothing is missing.

Each sample is a fresh process: it imports those modules, then times `import vllm_tmaguard.guard` and
`activate()`; the record's per-stage timings (timings_ms) come with it. Two kinds, alternated: a pod's
first process (an empty record directory: the full run with cold scan and verdict caches) and a later one
(the record directory the first filled: the verdict cache's replay, docs/design.md §4.1).

usage: python bench/guard_cost.py [--runs N] [--here] [--baseline [LABEL=]SITE ...]
  --here: measure this process's environment as it is (on a GPU host, or inside a pod) instead of the
          emulated pods; prints the table and writes nothing.
  --baseline [LABEL=]SITE: also measure the package installed in SITE (e.g. an earlier commit:
          `git worktree add /tmp/base <commit> && pip install --no-deps --no-build-isolation --target
          /tmp/base-site /tmp/base`), each of its processes alternating with this build's, so the rows come
          from the same minutes of the same machine; repeatable (LABEL names the rows, e.g. the commit)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STDLIB_OF_VLLM = """
import json, sys
try:
    import vllm.platforms  # with the guard off this may fail in a layer's pod; what it imported still counts
except Exception:
    pass
print(json.dumps(sorted(n for n in sys.modules if n.split(".")[0] in sys.stdlib_module_names)))
"""

# A child's first lines: the standard-library modules a vLLM process has loaded (argv[1], stdlib_of_vllm).
PRELOAD = """
import importlib, json, sys, time
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception:
        pass
"""

CHILD = PRELOAD + """
started = time.perf_counter()
from vllm_tmaguard.guard import activate
imported = time.perf_counter()
record = activate("bench")
done = time.perf_counter()
print("RESULT " + json.dumps({
    "import_ms": (imported - started) * 1e3, "activate_ms": (done - imported) * 1e3,
    "outcome": record and record["outcome"], "timings_ms": record and record["timings_ms"],
}))
"""


def stdlib_of_vllm(env: dict[str, str]) -> list[str]:
    """The standard-library modules a process has imported once vLLM's platform module is loaded."""
    done = subprocess.run(
        [sys.executable, "-c", STDLIB_OF_VLLM], env={**env, "TMAGUARD_MODE": "off"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def one_process(env: dict[str, str], preload: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, preload], env=env, capture_output=True, text=True, check=True
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def baseline_builds(baselines: list[str], env: dict[str, str]) -> dict[str, dict[str, str]]:
    """Each row label's environment: this build's (""), then each baseline's ([LABEL=]SITE), its site first
    on PYTHONPATH, before what the pod's processes import besides (vLLM's tree)."""
    builds: dict[str, dict[str, str]] = {"": {}}
    behind = env.get("PYTHONPATH", "")
    for baseline in baselines:
        label, _, site = baseline.rpartition("=")
        name = f" (baseline {label})" if label else " (baseline)"
        builds[name] = {"PYTHONPATH": f"{site}{os.pathsep}{behind}" if behind else site}
    return builds


def measure(setting: str, env: dict[str, str], runs: int, baselines: list[str] = ()) -> list[dict]:
    """The rows of one setting: its pods' first processes, and their later ones; with baselines (other
    builds of the package, first on PYTHONPATH), the same for each, their processes alternating with this
    build's, so all see the same machine."""
    builds = baseline_builds(list(baselines), env)
    firsts: dict[str, list[dict]] = {name: [] for name in builds}
    laters: dict[str, list[dict]] = {name: [] for name in builds}
    with tempfile.TemporaryDirectory() as base:
        preload = json.dumps(stdlib_of_vllm({**env, "TMAGUARD_RECORD_DIR": os.path.join(base, "probe")}))
        for name, extra in builds.items():  # the pod whose later processes are measured
            one_process({**env, **extra, "TMAGUARD_RECORD_DIR": os.path.join(base, f"warm{name}")}, preload)
        for run in range(runs):
            for name, extra in builds.items():
                fresh = {**env, **extra, "TMAGUARD_RECORD_DIR": os.path.join(base, f"fresh{name}-{run}")}
                firsts[name].append(one_process(fresh, preload))
                warm = {**env, **extra, "TMAGUARD_RECORD_DIR": os.path.join(base, f"warm{name}")}
                laters[name].append(one_process(warm, preload))
    return [
        row
        for name in builds
        for row in (_row(f"{setting}: first process{name}", firsts[name]),
                    _row(f"{setting}: later process{name}", laters[name]))
    ]  # fmt: skip


def _row(setting: str, results: list[dict]) -> dict:
    stages = sorted({stage for r in results for stage in r["timings_ms"] or {}})
    totals = sorted(r["import_ms"] + r["activate_ms"] for r in results)
    return {
        "setting": setting,
        "outcome": results[-1]["outcome"],
        "import": statistics.median(r["import_ms"] for r in results),
        "activate": statistics.median(r["activate_ms"] for r in results),
        "total": statistics.median(totals),
        "p90": totals[int(0.9 * (len(totals) - 1))],
        "stages": {
            s: statistics.median((r["timings_ms"] or {}).get(s, 0.0) for r in results) for s in stages
        },
    }


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| setting | outcome | import ms | activate ms | total ms | total p90 | per stage (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in row["stages"].items())
        lines.append(
            f"| {row['setting']} | {row['outcome']} | {row['import']:.2f} | {row['activate']:.2f} | "
            f"**{row['total']:.2f}** | {row['p90']:.2f} | {stages} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--here", action="store_true")
    parser.add_argument("--baseline", metavar="[LABEL=]SITE", action="append", default=[],
                        help="another build of the package, measured alongside (repeatable)")
    args = parser.parse_args()
    if args.here:
        rows = measure("this process's environment", dict(os.environ), args.runs, args.baseline)
        print("\n".join(table(rows)))
        return

    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "bench"))
    from _results import write_section
    from podkit import build_pod, scrubbed_environ

    base_env = scrubbed_environ()
    with tempfile.TemporaryDirectory() as base:
        pods = {kind: build_pod(Path(base), kind, cc="9.0") for kind in ("bare", "vcuda")}
        settings = {
            "emulated bare pod, H100 (nothing missing)": {**base_env, **pods["bare"].env},
            "emulated vCUDA pod, H100 (overlay loaded)": {**base_env, **pods["vcuda"].env},
            "this machine, no GPU": base_env,
        }
        rows = [
            row
            for setting, env in settings.items()
            for row in measure(setting, env, args.runs, args.baseline)
        ]
    lines = [
        "## Guard cost per process: import plus activation",
        "",
        f"Command: `.venv/bin/python bench/guard_cost.py --runs {args.runs}"
        + "".join(f" --baseline {b}" for b in args.baseline) + "`"
        + (", each SITE holding an earlier commit's package (the rows marked baseline, each of its processes "
           "alternating with this build's)" if args.baseline else "")
        + " (this CPU machine, emulated "
        "pods; the Hopper rows are in docs/real-layers.md). Each sample is a fresh process that first "
        "imports the standard-library modules vLLM's platform import loads, then times `import "
        "vllm_tmaguard.guard` and `activate()`; a pod's first process (empty record directory: the full "
        "run, cold caches) alternates with a later one (the verdict cache's replay). Targets (issue 19): "
        "<= 10 ms, <= 3 ms where nothing is missing.",
        "",
        *table(rows),
        "",
    ]
    print("\n".join(lines))
    write_section(str(ROOT / "docs" / "benchmarks.md"), lines)


if __name__ == "__main__":
    main()
