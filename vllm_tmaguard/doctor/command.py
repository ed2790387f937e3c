"""`tmaguard doctor ARGS`: argparse, not typer (typer and the pydantic it imports would cost ~150 ms, half
the doctor's time budget; vllm_tmaguard/__main__.py dispatches here before importing typer)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..redaction import redact
from ..toggles import read_toggles
from .children import DEFAULT_ACTIVE_TIMEOUT, DEFAULT_NVML_TIMEOUT
from .constants import SCHEMA
from .findings import conclude
from .gather import gather
from .render import render_json, render_text


def _seconds(minimum: float):  # type: ignore[no-untyped-def]
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"{text} is too small: at least {minimum:g} seconds")
        return value

    return parse


def _directory(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return os.path.abspath(text)


def parser() -> argparse.ArgumentParser:
    command = argparse.ArgumentParser(
        prog="tmaguard doctor",
        description="Why vLLM fails (or would fail) on this pod, and the exact fix. Passive by default: no "
        "torch or vLLM import, no CUDA context, no NVML (the GPUs from /proc/driver/nvidia).",
        epilog="Exit status: 0 healthy, 1 problems found (a bad TMAGUARD_* value too), 2 usage error.",
    )
    command.add_argument(
        "--json", dest="as_json", action="store_true", help=f"print the report as JSON ({SCHEMA})"
    )
    command.add_argument(
        "--active",
        action="store_true",
        help="also initialise CUDA in child processes through this pod's libcuda.so.1 and encode a tensor "
        "map on a real allocation (cuda-python, and vLLM's own binding after the guard)",
    )
    command.add_argument(
        "--nvml-timeout",
        type=_seconds(0.1),
        default=DEFAULT_NVML_TIMEOUT,
        metavar="SECONDS",
        help=f"with --active: how long the NVML child process may take (default {DEFAULT_NVML_TIMEOUT:g})",
    )
    command.add_argument(
        "--active-timeout",
        type=_seconds(1.0),
        default=DEFAULT_ACTIVE_TIMEOUT,
        metavar="SECONDS",
        help=f"how long each --active child process may take (default {DEFAULT_ACTIVE_TIMEOUT:g})",
    )
    command.add_argument(
        "--vllm-dir",
        type=_directory,
        metavar="DIR",
        help="the vllm package directory to inspect (default: the one this Python would import); torch, "
        "Triton and the CUDA runtime are then looked for beside it first",
    )
    return command


def main(argv: list[str]) -> int:
    """`tmaguard doctor ARGS`; returns the exit status."""
    args = parser().parse_args(argv)  # exits 2 on a usage error
    toggles, toggle_problems = read_toggles(os.environ)  # a bad one is a finding, as the guard falls back
    started = time.perf_counter()
    try:
        gathered = gather(
            os.environ,
            toggles,
            nvml_timeout=args.nvml_timeout,
            vllm_dir=args.vllm_dir,
            active=args.active,
            active_timeout=args.active_timeout,
        )
        gathered["toggle_problems"] = [problem.to_json() for problem in toggle_problems]
        report = conclude(gathered)
    except Exception as error:  # a bug of ours: one clear line, not a traceback
        print(redact(f"tmaguard doctor: internal error: {type(error).__name__}: {error}"), file=sys.stderr)
        return 1
    report["elapsed_ms"] = round((time.perf_counter() - started) * 1e3, 1)
    report = redact(report)  # it quotes paths, records and child processes' output: no secrets in it
    if args.as_json:
        sys.stdout.write(render_json(report))
    else:
        render_text(report)
    return report["exit_code"]
