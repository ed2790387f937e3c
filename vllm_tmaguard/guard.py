"""One activation per process: facts -> decision -> actions -> one record. Fails open: on its own error
the guard logs one line and gets out of the way, unless strict mode asks it to stop start-up."""

from __future__ import annotations

import errno
import os
import threading
import time
from typing import Any

from .actions import Outcome, apply_routing, apply_supplies
from .decision import decide
from .facts import Facts, probe
from .gpu import probe_gpus
from .record import build_record, emit, log_line, process_record_path, write_record
from .toggles import ToggleError, parse_toggles, strict_requested
from .trust import private_dir, probe_root_problem, redact


class GuardStop(SystemExit):
    """Stops start-up in strict mode. A SystemExit, because vLLM's plugin loader swallows Exceptions."""

    def __init__(self, cause: str, fix: str) -> None:
        self.cause, self.fix = cause, fix
        super().__init__(f"vllm-tmaguard (TMAGUARD_STRICT=1) stopped start-up: {cause}. Fix: {fix}")


_MISSING = os.strerror(errno.ENOENT)  # elf.ElfError's reason for a file that is not there
_lock = threading.Lock()
_activated = False
_record: dict[str, Any] | None = None
_record_dir: str | None = None  # where the first activation wrote its record
_log_format = "text"


def activate(trigger: str) -> dict[str, Any] | None:
    """Runs the guard once per process; later calls (plugin after import hook, workers' second call) return
    the first call's record. A forked child (vLLM's EngineCore and workers under the fork start method)
    inherits the parent's libraries and knobs: its first call writes and logs its own record of that."""
    global _activated, _record
    with _lock:
        if _activated:
            if _record is not None and _record["pid"] != os.getpid():
                _record = _inherited(_record, trigger)
            return _record
        _activated = True
        _record = _run(trigger)
        return _record


def _inherited(parent: dict[str, Any], trigger: str) -> dict[str, Any]:
    """The record of a forked child: the parent's findings and actions, which it inherited, under its own
    pid. Written and logged like a first activation's; fails open."""
    record = {
        **parent,
        "pid": os.getpid(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "trigger": f"{trigger} (forked from pid {parent['pid']}: inherits its libraries and knobs)",
        "forked_from": parent["pid"],
        "elapsed_ms": 0.0,
    }
    try:
        if _record_dir is not None:
            record["record_file"] = process_record_path(_record_dir, record["pid"])
            write_record(record, _record_dir)
        emit(record, "warning" if record["failed"] else "info", _log_format)
    except Exception as error:  # the guard must never make start-up worse
        log_line("warning", f"tmaguard: internal error recording a forked process: {error}")
    return record


def _run(trigger: str) -> dict[str, Any] | None:
    global _record_dir, _log_format
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
        # The overlay's file, the scan cache and last.json go only to a directory that is ours alone.
        runtime_dir, dir_problem = private_dir(toggles.record_dir)
        faults = [] if dir_problem is None else [f"TMAGUARD_RECORD_DIR unusable: {dir_problem}"]
        # Passive only: the GPUs from the kernel module's files, never NVML (in a vCUDA pod NVML is the layer).
        facts = probe(environ, toggles.root, trigger, gpu=probe_gpus(toggles.root), cache_dir=runtime_dir)
        decision = decide(facts, toggles)
        outcome = Outcome()
        if toggles.mode == "auto":
            refused = probe_root_problem(toggles.root, facts.driver.resolution.how, facts.driver.path)
            if refused is None:
                outcome = apply_supplies(decision, runtime_dir)
            else:
                faults.append(refused)
        if decision.apply:
            outcome += apply_routing(decision)
        if decision.level != "debug":  # no GPU and no libcuda.so.1: nothing the faults could matter to
            outcome += Outcome(failed=(*faults, *_probe_faults(facts)))
        record = build_record(facts, decision, outcome, toggles.mode, (time.perf_counter() - started) * 1e3)
        if runtime_dir is not None:
            record["record_file"] = process_record_path(runtime_dir, record["pid"])
        written = runtime_dir is None or write_record(record, runtime_dir) is not None
        if not written and decision.level != "debug":
            note = redact(f"could not write the record to {runtime_dir}")
            record["failed"].append(note)
            outcome += Outcome(failed=(note,))
        level = "warning" if outcome.failed else decision.level
        _record_dir, _log_format = (runtime_dir if written else None), toggles.log_format
        emit(record, level, toggles.log_format)
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


def _probe_faults(facts: Facts) -> list[str]:
    """What the probes could not find out, each a cause strict mode stops on. An extension file the wheel
    lists but the image lacks is none: nothing can load it, so it needs nothing (the doctor lists them)."""
    faults = []
    if facts.gpu.error and facts.driver.info is not None:
        faults.append(f"{facts.gpu.error}: the GPUs are unknown, so no kernel is routed for them")
    faults += [
        f"cannot read {e.path}: {e.error}; what {e.module} needs from libcuda.so.1 is unknown"
        for e in facts.vllm.extensions
        if e.error and e.error != _MISSING
    ]
    return faults
