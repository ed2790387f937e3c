"""The full run, a straight script over the stages (docs/design.md §4), for a process whose verdict is not
in the cache (verdict.py):

  toggles -> record directory -> file facts -> plan what to supply -> supply -> GPUs -> plan routing ->
  route -> record -> remember the verdict

Each stage but the two that act is a pure function of what came before; the stages see only the part of the
environment the cache watches (inputs.watched_environ). Fails open: on its own error the guard logs one line
and gets out of the way, unless strict mode asks it to stop start-up."""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from .actions import apply_routing, apply_supply, replay_plan
from .catalogue import DRIVER_LIBRARY
from .codes import (
    EXTENSION_UNREADABLE,
    IMPORTED_EARLY,
    OVERLAY_FAILED,
    RECORD_NOT_WRITTEN,
    ROOT_REFUSED,
    ROUTING_IMPOSSIBLE,
    SHIM_FAILED,
)
from .facts import Facts, probe
from .gpu import probe_gpus
from .inputs import ENV_NAMES, ENV_PREFIXES, file_inputs, watched_environ
from .outcomes import Problem
from .record import Record, assemble, level_of, line_parts
from .redaction import MIN_SECRET, redact, shows_redaction
from .routing import plan_routing_after
from .store import not_written, open_record_dir
from .supply import plan_supply
from .toggles import read_toggles
from .trust import probe_root_problem
from .verdict import Verdict, announce, by_effect, log, observe_process, remember, written

TERMINATION_LOG = "/dev/termination-log"  # Kubernetes' default terminationMessagePath
# Problems of this process alone, not of its inputs: a verdict holding one is not replayed to others.
_OF_THIS_PROCESS = frozenset({IMPORTED_EARLY, OVERLAY_FAILED, SHIM_FAILED, RECORD_NOT_WRITTEN})


class GuardStop(SystemExit):
    """Stops start-up in strict mode. A SystemExit, because vLLM's plugin loader swallows Exceptions."""

    def __init__(self, cause: str, fix: str) -> None:
        self.cause, self.fix = cause, fix
        super().__init__(f"vllm-tmaguard (TMAGUARD_STRICT=1) stopped start-up: {cause}. Fix: {fix}")


class _Clock:
    """Milliseconds per stage, for the record."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.times[stage] = round((now - self._last) * 1e3, 3)
        self._last = now


def run(trigger: str) -> tuple[Verdict, str | None] | None:
    """The process's verdict, done, written and logged, with the directory it was written to; None when
    TMAGUARD_MODE=off or on the guard's own error."""
    clock = _Clock()
    process = observe_process(DRIVER_LIBRARY, ENV_NAMES, ENV_PREFIXES)  # before the stages change anything
    environ = watched_environ(os.environ)
    toggles, toggle_problems = read_toggles(environ)
    if toggles.mode == "off":
        log("debug", "tmaguard: TMAGUARD_MODE=off, doing nothing")
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
        verdict = issued(_verdict(record, toggles.log_format), records.path)
        stop = _stop_if_asked(verdict.record["problems"], toggles.strict)
    except Exception as error:  # the guard must never make start-up worse
        message = f"tmaguard: internal error, leaving vLLM as it is: {type(error).__name__}: {error}"
        log("warning", redact(message))
        if toggles.strict:
            stop = GuardStop(
                f"internal error {type(error).__name__}: {error}", "report it, or set TMAGUARD_MODE=off"
            )
            raise _told_kubernetes(stop, toggles.root) from error
        return None
    if stop:
        raise _told_kubernetes(stop, toggles.root)
    if records.path and not records.refused and _replayable(verdict):
        with contextlib.suppress(Exception):  # not remembered: later processes run the full run too
            _remember(process, facts, toggles.root, records.path, record, verdict)
    return verdict, records.path if verdict.record["record_file"] else None


def _remember(
    process: dict[str, Any], facts: Facts, root: str, directory: str, record: Record, verdict: Verdict
) -> None:
    """Keeps the verdict for the pod's later processes, with what it was decided from (docs/design.md
    §4.1)."""
    inputs, library_path_read = file_inputs(facts, root, directory, record.actions)
    compared = process if library_path_read else by_effect(process)
    replaying = {"redo": replay_plan(record.actions), "secret_min": MIN_SECRET}
    remember(directory, compared, inputs, verdict, replaying)


def _verdict(record: Record, log_format: str) -> Verdict:
    return Verdict(record.to_json(), level_of(record), *line_parts(record), log_format)


def issued(verdict: Verdict, directory: str | None) -> Verdict:
    """The verdict written (where there is a directory) and logged; a refused write is a problem of its
    record (a forked child's too: guard.py)."""
    if directory is not None:
        try:
            verdict = written(verdict, directory)
        except OSError as error:
            record = Record.from_json(verdict.record)
            record = record._replace(problems=(*record.problems, not_written(directory, error)))
            verdict = _verdict(record, verdict.log_format)
    announce(verdict)
    return verdict


def _replayable(verdict: Verdict) -> bool:
    """A verdict other processes may replay: written, kept in a file (not in memory), no problem of this
    process alone, nothing redacted (what was depends on this process's secrets)."""
    record = verdict.record
    in_memory = any(action["in_memory"] for action in record["actions"])
    own = any(problem["code"] in _OF_THIS_PROCESS for problem in record["problems"])
    redacted = shows_redaction(json.dumps(record)) or shows_redaction(" ".join(verdict.essential))
    return bool(record["record_file"]) and not in_memory and not own and not redacted


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


def _stop_if_asked(problems: list[dict[str, Any]], strict: bool) -> GuardStop | None:
    """Strict mode stops on any problem of the record as issued (a refused write included), naming each; an
    impossible routing demand stops start-up in any mode."""
    impossible = [p for p in problems if p["code"] == ROUTING_IMPOSSIBLE]
    stopping = impossible or (problems if strict else [])
    return GuardStop("; ".join(p["cause"] for p in stopping), stopping[0]["fix"]) if stopping else None


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
