"""One activation per process: facts -> decision -> actions -> one record. Fails open: on its own error
the guard logs one line and gets out of the way, unless strict mode asks it to stop start-up."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from typing import Any

from .actions import Outcome, apply_routing, apply_supplies
from .decision import decide
from .facts import probe
from .gpu import GpuFacts, probe_gpus
from .record import build_record, emit, log_line, write_record
from .toggles import ToggleError, parse_toggles, strict_requested


class GuardStop(SystemExit):
    """Stops start-up in strict mode. A SystemExit, because vLLM's plugin loader swallows Exceptions."""

    def __init__(self, cause: str, fix: str) -> None:
        self.cause, self.fix = cause, fix
        super().__init__(f"vllm-tmaguard (TMAGUARD_STRICT=1) stopped start-up: {cause}. Fix: {fix}")


GPU_NOT_ASKED_YET = GpuFacts(error="NVML not asked yet", source="deferred")
_lock = threading.Lock()
_activated = False
_record: dict[str, Any] | None = None


def activate(trigger: str) -> dict[str, Any] | None:
    """Runs the guard once per process; later calls (plugin after import hook, workers' second call) return
    the first call's record."""
    global _activated, _record
    with _lock:
        if _activated:
            return _record
        _activated = True
        _record = _run(trigger)
        return _record


def _run(trigger: str) -> dict[str, Any] | None:
    started = time.perf_counter()
    environ = os.environ
    try:
        toggles = parse_toggles(environ)
    except ToggleError as error:
        log_line("error", f"tmaguard: {error}; the guard does nothing in this process")
        if strict_requested(environ):
            raise GuardStop(str(error), f"set {error.name} to one of: {error.allowed}") from None
        return None
    if toggles.mode == "off":
        log_line("debug", "tmaguard: TMAGUARD_MODE=off, doing nothing")
        return None
    try:
        # NVML's nvmlInit loads libcuda.so.1 (measured on driver 580), so the file probes come first and
        # the overlay or shims are loaded before the GPU is asked about; what to supply does not depend on
        # the GPU, how to route does.
        facts = probe(environ, toggles.root, trigger, gpu=GPU_NOT_ASKED_YET, cache_dir=toggles.record_dir)
        outcome = Outcome()
        if toggles.mode == "auto":
            outcome = apply_supplies(decide(facts, toggles), toggles.record_dir)
        facts = replace(facts, gpu=probe_gpus())
        decision = decide(facts, toggles)
        if decision.apply:
            outcome += apply_routing(decision)
        record = build_record(facts, decision, outcome, toggles.mode, (time.perf_counter() - started) * 1e3)
        level = "warning" if outcome.failed else decision.level
        emit(record, level, toggles.log_format)
        write_record(record, toggles.record_dir)
    except Exception as error:  # the guard must never make start-up worse
        log_line(
            "warning", f"tmaguard: internal error, leaving vLLM as it is: {type(error).__name__}: {error}"
        )
        if toggles.strict:
            raise GuardStop(
                f"internal error {type(error).__name__}: {error}", "report it, or set TMAGUARD_MODE=off"
            ) from error
        return None
    if decision.fatal:
        raise GuardStop(
            decision.fatal, "set TMAGUARD_GEMM=auto (or portable) to let the guard route around it"
        )
    if toggles.strict and (decision.problem or outcome.failed):
        raise GuardStop(
            decision.problem or "; ".join(outcome.failed),
            "see `tmaguard doctor`; or set TMAGUARD_STRICT=0 to start with the problem logged",
        )
    return record
