"""One activation per process (docs/design.md §4): the verdict cache's replay where a process before this one
decided on the same inputs (verdict.py), else the full run (pipeline.py); either way one record issued
(issue.py). Fails open around everything: whatever goes wrong in the replay, the full run decides; whatever
goes wrong there or before it (a working directory that is gone, an environment it cannot read), vLLM goes on
as without the guard, with one line saying so, unless strict mode asks to stop."""

from __future__ import annotations

import os
import threading
from typing import Any

from .issue import Issued, issue, log
from .verdict import for_process, replay

_lock = threading.Lock()
_activated = False
_issued: Issued | None = None


def activate(trigger: str) -> dict[str, Any] | None:
    """Runs the guard once per process; later calls (plugin after import hook, workers' second call) return
    the first call's record. A forked child (vLLM's EngineCore and workers under the fork start method)
    inherits the parent's libraries and knobs: its first call issues its own record of that."""
    global _activated, _issued
    with _lock:
        if not _activated:
            _activated = True
            _issued = _fail_open(_decide, trigger)
        elif _issued is not None and _issued.document["pid"] != os.getpid():
            _issued = _fail_open(_inherited, _issued, trigger) or _issued
        return None if _issued is None else _issued.document


def _decide(trigger: str) -> Issued | None:
    try:
        replayed = replay(trigger)
    except Exception:  # a cache that cannot be read or replayed is a miss
        replayed = None
    if replayed is not None:
        return replayed
    from .stages.pipeline import run  # the full run's imports, only where no verdict is cached

    return run(trigger)


def _inherited(parent: Issued, trigger: str) -> Issued:
    pid = parent.document["pid"]
    document = for_process(
        parent.document,
        f"{trigger} (forked from pid {pid}: inherits its libraries and knobs)",
        forked_from=pid,
        replayed_from=None,
        elapsed_ms=0.0,
        timings_ms={},
    )
    return issue(document, parent.directory, parent.log_format)


def _fail_open(step: Any, *args: Any) -> Issued | None:
    """The step's result; on the guard's own error one line and None (strict mode: a stop). A stop the step
    raised (a SystemExit) passes."""
    try:
        return step(*args)
    except Exception as error:
        from .redaction import redact
        from .stop import internal_stop, tell_kubernetes

        log(
            "warning",
            redact(f"tmaguard: internal error, leaving vLLM as it is: {type(error).__name__}: {error}"),
        )
        if os.environ.get("TMAGUARD_STRICT", "").strip() == "1":
            raise tell_kubernetes(internal_stop(error)) from error
        return None
