"""One activation per process (docs/design.md §4): the verdict cache's replay where a process before this one
decided on the same inputs (verdict.py), else the full run (pipeline.py). Fails open: whatever goes wrong in
the replay, the full run decides; whatever goes wrong there, vLLM goes on as without the guard (unless strict
mode asks to stop)."""

from __future__ import annotations

import os
import threading
from typing import Any

from .verdict import Verdict, announce, log, replay, written

_lock = threading.Lock()
_activated = False
_verdict: Verdict | None = None
_record_dir: str | None = None  # where the first activation wrote its record


def activate(trigger: str) -> dict[str, Any] | None:
    """Runs the guard once per process; later calls (plugin after import hook, workers' second call) return
    the first call's record. A forked child (vLLM's EngineCore and workers under the fork start method)
    inherits the parent's libraries and knobs: its first call writes and logs its own record of that."""
    global _activated, _verdict, _record_dir
    with _lock:
        if _activated:
            if _verdict is not None and _verdict.record["pid"] != os.getpid():
                _verdict = _inherited(_verdict, trigger)
        else:
            _activated = True
            decided = _replayed(trigger)
            if decided is None:
                from .pipeline import run  # the full run's imports, only where no verdict is cached

                decided = run(trigger)
            _verdict, _record_dir = decided if decided is not None else (None, None)
        return None if _verdict is None else _verdict.record


def _replayed(trigger: str) -> tuple[Verdict, str | None] | None:
    try:
        return replay(trigger)
    except Exception:  # a cache that cannot be read or replayed is a miss
        return None


def _inherited(parent: Verdict, trigger: str) -> Verdict:
    pid = parent.record["pid"]
    verdict = parent.for_process(
        f"{trigger} (forked from pid {pid}: inherits its libraries and knobs)",
        forked_from=pid,
        replayed_from=None,
        elapsed_ms=0.0,
        timings_ms={},
    )
    try:
        return _issued(verdict, _record_dir)
    except Exception as error:  # the guard must never make start-up worse
        log("warning", f"tmaguard: internal error recording a forked process: {type(error).__name__}")
        return verdict


def _issued(verdict: Verdict, directory: str | None) -> Verdict:
    """Written and logged without the full run's modules; a refused write takes the full run's way (a
    problem of the record)."""
    if directory is not None:
        try:
            written(verdict, directory)
        except OSError:
            from .pipeline import issued

            return issued(verdict, directory)
    announce(verdict)
    return verdict
