"""One activation per process, a straight script over the stages (docs/design.md §4):

  toggles -> record directory -> file facts -> plan what to supply -> supply -> GPUs -> plan routing ->
  route -> record

Each stage but the two that act is a pure function of what came before. Fails open: on its own error the
guard logs one line and gets out of the way, unless strict mode asks it to stop start-up."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from .actions import apply_routing, apply_supply
from .facts import Facts, probe
from .gpu import probe_gpus
from .outcomes import EXTENSION_UNREADABLE, ROOT_REFUSED, ROUTING_IMPOSSIBLE, Problem
from .record import Record, assemble, emit, log_line
from .routing import plan_routing_after
from .store import open_record_dir, process_record_path, write_record
from .supply import plan_supply
from .toggles import read_toggles
from .trust import probe_root_problem

_lock = threading.Lock()
_activated = False
_record: Record | None = None
_record_dir: str | None = None  # where the first activation wrote its record
_log_format = "text"


TERMINATION_LOG = "/dev/termination-log"  # Kubernetes' default terminationMessagePath


class GuardStop(SystemExit):
    """Stops start-up in strict mode. A SystemExit, because vLLM's plugin loader swallows Exceptions."""

    def __init__(self, cause: str, fix: str) -> None:
        self.cause, self.fix = cause, fix
        super().__init__(f"vllm-tmaguard (TMAGUARD_STRICT=1) stopped start-up: {cause}. Fix: {fix}")


def _told_kubernetes(stop: GuardStop, root: str) -> GuardStop:
    """The stop's line where `kubectl describe pod` shows it: the container's termination message file,
    appended to where the kubelet made one (never created: outside Kubernetes there is none)."""
    try:
        fd = os.open(os.path.join(root, TERMINATION_LOG.lstrip("/")), os.O_WRONLY | os.O_APPEND)
        with os.fdopen(fd, "w") as file:
            file.write(f"{stop.code}\n")
    except OSError:
        pass
    return stop


def activate(trigger: str) -> dict[str, Any] | None:
    """Runs the guard once per process; later calls (plugin after import hook, workers' second call) return
    the first call's record. A forked child (vLLM's EngineCore and workers under the fork start method)
    inherits the parent's libraries and knobs: its first call writes and logs its own record of that."""
    global _activated, _record
    with _lock:
        if _activated:
            if _record is not None and _record.pid != os.getpid():
                _record = _inherited(_record, trigger)
        else:
            _activated = True
            _record = _run(trigger)
        return None if _record is None else _record.to_json()


def _inherited(parent: Record, trigger: str) -> Record:
    record = parent.forked(trigger)
    try:
        if _record_dir is not None:
            record = _written(record, _record_dir)
        emit(record, _log_format)
    except Exception as error:  # the guard must never make start-up worse
        log_line("warning", f"tmaguard: internal error recording a forked process: {error}")
    return record


class _Clock:
    """Milliseconds per stage, for the record."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.times[stage] = round((now - self._last) * 1e3, 3)
        self._last = now


def _run(trigger: str) -> Record | None:
    global _record_dir, _log_format
    clock = _Clock()
    environ = os.environ
    toggles, toggle_problems = read_toggles(environ)
    if toggles.mode == "off":
        log_line("debug", "tmaguard: TMAGUARD_MODE=off, doing nothing")
        return None
    try:
        apply = toggles.mode == "auto"
        records = open_record_dir(toggles.record_dir)
        clock.lap("toggles")
        facts = probe(environ, toggles.root, trigger, cache_dir=records.path)
        clock.lap("facts")
        plan = plan_supply(facts, toggles)
        refused = probe_root_problem(toggles.root, facts.driver.resolution.how, facts.driver.path)
        supplies = plan.supplies if refused is None else ()
        supplied, supply_problems = apply_supply(supplies, facts.driver.path or "", records.path, apply)
        clock.lap("supply")
        gpus = probe_gpus(toggles.root)
        clock.lap("gpus")
        route = plan_routing_after(facts, gpus, plan, toggles.gemm)
        routed, routing_problems = apply_routing(route.routing, apply) if route else ((), ())
        clock.lap("routing")
        # What breaks vLLM first, then what concerns the guard's settings; without a GPU, no driver is none.
        unsupplied = () if not gpus.present and plan.status == "no-driver" else plan.problems
        problems = (
            *unsupplied, *_root_problem(refused), *supply_problems, *routing_problems,
            *(route.problems if route else ()), *_probe_problems(facts), *toggle_problems,
            *([records.problem()] if records.refused else []),
        )  # fmt: skip
        record = assemble(
            trigger, toggles.mode, facts, gpus, plan, route, supplied + routed, problems, clock.times
        )
        if records.path is not None:
            record = _written(record, records.path)
        _record_dir = records.path if record.record_file else None
        _log_format = toggles.log_format
        emit(record, toggles.log_format)
    except Exception as error:  # the guard must never make start-up worse
        log_line(
            "warning", f"tmaguard: internal error, leaving vLLM as it is: {type(error).__name__}: {error}"
        )
        if toggles.strict:
            stop = GuardStop(
                f"internal error {type(error).__name__}: {error}", "report it, or set TMAGUARD_MODE=off"
            )
            raise _told_kubernetes(stop, toggles.root) from error
        return None
    if stop := _stop_if_asked(record, toggles.strict):
        raise _told_kubernetes(stop, toggles.root)
    return record


def _written(record: Record, directory: str) -> Record:
    """The record with its file, or with the problem that it could not be written."""
    path = process_record_path(directory, record.pid)
    with_file = record._replace(record_file=path)
    problem = write_record(with_file.to_json(), directory, record.pid)
    return with_file if problem is None else record._replace(problems=(*record.problems, problem))


def _stop_if_asked(record: Record, strict: bool) -> GuardStop | None:
    """Strict mode stops on any problem, naming each; an impossible routing demand stops start-up in any
    mode."""
    impossible = [p for p in record.problems if p.code == ROUTING_IMPOSSIBLE]
    stopping = impossible or (list(record.problems) if strict else [])
    return GuardStop("; ".join(p.cause for p in stopping), stopping[0].fix) if stopping else None


def _root_problem(refused: str | None) -> tuple[Problem, ...]:
    if refused is None:
        return ()
    return (
        Problem(
            ROOT_REFUSED,
            cause=refused,
            consequence="nothing is loaded: vLLM's extensions fail as without the guard",
            fix="unset TMAGUARD_ROOT (it is for tests and for inspecting a pod's files from outside)",
            subject="TMAGUARD_ROOT",
        ),
    )


def _probe_problems(facts: Facts) -> tuple[Problem, ...]:
    """Extension files that could not be read. One the wheel lists but the image lacks is none: nothing can
    load it, so it needs nothing (the doctor lists them)."""
    return tuple(
        Problem(
            EXTENSION_UNREADABLE,
            cause=f"cannot read {e.path}: {e.error}",
            consequence=f"what {e.module} needs from libcuda.so.1 is unknown, so nothing is supplied for it",
            fix="reinstall vLLM (pip install --force-reinstall vllm)",
            subject=e.path,
        )
        for e in facts.vllm.extensions
        if e.error and not e.absent
    )
