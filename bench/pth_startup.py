"""What vllm_tmaguard.pth adds to interpreter start-up, measured side by side in fresh processes.

Each process starts normally (site has run, as it has when our .pth line runs), unloads our modules and
disarms the hook, then times site.addsitedir() on a directory holding only our .pth and on an empty
directory, in alternating order; the difference is the hook's cost. Also reports python -X importtime's
figure for the hook's modules. Writes a section of docs/benchmarks.md."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile

from _results import write_section

RUNS = 40
CHILD = """
import site, sys, time
import vllm_tmaguard._import_hook as hook
hook.disarm()
del sys.modules["vllm_tmaguard._import_hook"], sys.modules["vllm_tmaguard"]
first, second = (sys.argv[1], sys.argv[2]) if sys.argv[4] == "0" else (sys.argv[2], sys.argv[1])
times = {}
for directory in (first, second):
    start = time.perf_counter_ns()
    site.addsitedir(directory)
    times[directory] = time.perf_counter_ns() - start
assert "vllm_tmaguard._import_hook" in sys.modules
print(times[sys.argv[1]], times[sys.argv[2]])
"""


def measure() -> tuple[list[float], list[float]]:
    purelib = sysconfig.get_paths()["purelib"]
    with tempfile.TemporaryDirectory() as with_pth, tempfile.TemporaryDirectory() as empty:
        with (
            open(os.path.join(purelib, "vllm_tmaguard.pth")) as src,
            open(os.path.join(with_pth, "vllm_tmaguard.pth"), "w") as dst,
        ):
            dst.write(src.read())
        hooked, plain = [], []
        for run in range(RUNS):
            out = subprocess.run(
                [sys.executable, "-S", "-c", CHILD, with_pth, empty, purelib, str(run % 2)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            hooked.append(int(out[0]) / 1e3)
            plain.append(int(out[1]) / 1e3)
    return hooked, plain


def importtime() -> float:
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True
    ).stderr
    cumulative = [
        int(line.split("|")[1]) for line in err.splitlines() if line.rstrip().endswith("vllm_tmaguard")
    ]
    return cumulative[-1] if cumulative else float("nan")


def main() -> None:
    hooked, plain = measure()
    added = [h - p for h, p in zip(hooked, plain, strict=True)]
    median = statistics.median(added)
    lines = [
        "## Interpreter start-up: the .pth import hook",
        "",
        f"Command: `.venv/bin/python bench/pth_startup.py` ({RUNS} fresh processes, alternating order).",
        "",
        "| | median µs | p90 µs |",
        "|---|---|---|",
        f"| site dir with vllm_tmaguard.pth | {statistics.median(hooked):.0f} | "
        f"{statistics.quantiles(hooked, n=10)[-1]:.0f} |",
        f"| empty site dir | {statistics.median(plain):.0f} | {statistics.quantiles(plain, n=10)[-1]:.0f} |",
        f"| **added by the hook** | **{median:.0f}** | {statistics.quantiles(added, n=10)[-1]:.0f} |",
        "",
        f"`python -X importtime -c pass`: vllm_tmaguard (package + hook) cumulative {importtime()} µs.",
        f"Target: < 1000 µs. {'Met' if median < 1000 else 'NOT met'}.",
        "",
    ]
    print("\n".join(lines))
    write_section("docs/benchmarks.md", lines)


if __name__ == "__main__":
    main()
