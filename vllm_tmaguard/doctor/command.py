"""`tmaguard doctor ARGS`: argparse, not typer (typer and the pydantic it imports would cost ~150 ms, half
the doctor's time budget; vllm_tmaguard/__main__.py dispatches here before importing typer)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import time
from typing import Any

from ..codes import EXIT_INTERNAL
from ..issue import printable
from ..redaction import redact
from ..stages.door import discard_into_null, write_private
from ..stages.store import open_record_dir
from ..stages.toggles import read_toggles
from .children import DEFAULT_ACTIVE_TIMEOUT, DEFAULT_NVML_TIMEOUT
from .constants import SCHEMA
from .findings import conclude
from .gather import gather
from .render import render_json, render_text

REPORT_FILE = "doctor.json"


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
        epilog="Exit status: 0 healthy, 1 problems found (a bad TMAGUARD_* value, a damaged record file "
        "too), 2 usage error, 3 the doctor itself failed (never a diagnosis).",
    )
    command.add_argument(
        "--json", dest="as_json", action="store_true", help=f"print the report as JSON ({SCHEMA})"
    )
    command.add_argument(
        "--save",
        action="store_true",
        help=f"also write the JSON report to {REPORT_FILE} in the guard's record directory (as the guard "
        "writes its records: only into a directory that is this user's alone, never through a link)",
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
    """`tmaguard doctor ARGS`; returns the exit status (codes.EXIT_*)."""
    args = parser().parse_args(argv)  # exits 2 on a usage error
    try:
        if sys.stdout is None:
            raise OSError(errno.EBADF, "standard output is closed")
        report = _report(args)
        if args.save:
            report["saved"] = _save(report)
        if args.as_json:
            sys.stdout.write(render_json(report))
        else:
            render_text(printable_strings(report))
        sys.stdout.flush()  # a standard output that fails (closed, full, a broken pipe) fails here
    except Exception as error:  # a bug of ours, or an output that fails: a status no finding has
        return _failed(error, args.as_json)
    return report["exit_code"]


def _failed(error: Exception, as_json: bool) -> int:
    """The doctor's own failure: one line on stderr and, with --json, a report that says so, each where it
    can still be written (standard output may be what failed). EXIT_INTERNAL whatever happens here."""
    message = printable(redact(f"tmaguard doctor: internal error: {type(error).__name__}: {error}"))
    with contextlib.suppress(Exception):
        print(message, file=sys.stderr, flush=True)
    if as_json:
        failed = {"schema": SCHEMA, "status": "internal-error", "exit_code": EXIT_INTERNAL, "error": message}
        with contextlib.suppress(Exception):
            sys.stdout.write(render_json(failed))
            sys.stdout.flush()
    _discard_output()
    return EXIT_INTERNAL


def _discard_output() -> None:
    """What standard output could not take is dropped: the interpreter's own flush at exit would fail
    again and turn the exit status into 120."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        return
    with contextlib.suppress(Exception):
        discard_into_null(sys.stdout.fileno())


def _report(args: argparse.Namespace) -> dict[str, Any]:
    toggles, toggle_problems = read_toggles(os.environ)  # a bad one is a finding, as the guard falls back
    started = time.perf_counter()
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
    report["elapsed_ms"] = round((time.perf_counter() - started) * 1e3, 1)
    return redact(report)  # it quotes paths, records and child processes' output: no secrets in it


def _save(report: dict[str, Any]) -> dict[str, Any]:
    """doctor.json in the guard's own private directory, judged and written as the guard writes its records
    (store.py, files.py): never through a link, never into another user's directory."""
    toggles, _ = read_toggles(os.environ)
    records = open_record_dir(toggles.record_dir)
    if records.path is None:
        return {"path": None, "error": records.refused}
    try:
        path = write_private(records.path, REPORT_FILE, render_json(report).encode())
    except OSError as error:
        return {"path": None, "error": str(error)}
    return {"path": path, "error": None}


def printable_strings(value: Any) -> Any:
    """The report with every string printable on any stream (line.printable), its line breaks kept (a fix's
    manifest snippet spans lines)."""
    if isinstance(value, str):
        return "\n".join(printable(line) for line in value.split("\n"))
    if isinstance(value, dict):
        return {key: printable_strings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [printable_strings(item) for item in value]
    return value
