"""The full run, a straight script over the stages (docs/design.md §4), for a process whose verdict is not
in the cache (verdict.py):

  toggles -> record directory -> file facts -> plan what to supply -> supply -> GPUs -> plan routing ->
  route -> record (typed) -> issue (written and logged: issue.py) -> stop if asked -> remember the verdict

Each stage but the two that act is a pure function of what came before; the stages see only the part of the
environment the cache watches (inputs.watched_environ), and every file they read goes through the door,
which notes it (door.noting): those notes are the verdict's file inputs. Fails open: on its own error the
guard logs one line and gets out of the way, unless strict mode asks it to stop start-up (guard.py)."""

import contextlib
import json
import os
import time
from typing import Any

from .. import __version__
from ..codes import (
    EXTENSION_UNREADABLE,
    IMPORTED_EARLY,
    OVERLAY_FAILED,
    RECORD_NOT_WRITTEN,
    ROOT_REFUSED,
    SHIM_FAILED,
)
from ..issue import Issued, issue, log
from ..process import LIBRARY_PATH
from ..redaction import MIN_SECRET, secret_values, shows_redaction
from ..stop import stop_for, tell_kubernetes
from ..verdict import CACHE_FILE, CACHE_FORMAT, ENTRIES_KEPT, load_entries, observe_process, shown_variables
from . import door
from .actions import apply_launch, apply_routing, apply_supply, replay_plan
from .catalogue import DRIVER_LIBRARY
from .compat import BYPASSED, bypass_problem, plan_compat
from .facts import Facts, probe
from .gpu import GpuFacts, probe_gpus
from .inputs import ENV_NAMES, ENV_PREFIXES, watched_environ
from .layers import LABELS
from .memory import FRACTION_FLAG, GIVEN_PORTION, MemoryFlags, MemoryPlan, plan_memory, read_limit
from .metering import NOT_IN_FORCE_CONDITIONS, layer_problems, memory_unlimited
from .outcomes import Action, Problem
from .preloads import NOT_LOADED
from .record import Record, assemble
from .routing import RoutePlan, plan_routing_after
from .runtime_cuda import driver_problems
from .store import RecordDir, open_record_dir
from .supply import SupplyPlan, plan_supply
from .toggles import Toggles, read_toggles
from .trust import probe_root_problem, writable_layer
from .values import value_type

# Problems of this process alone, not of its inputs: a verdict holding one is not replayed to others.
_OF_THIS_PROCESS = frozenset({IMPORTED_EARLY, OVERLAY_FAILED, SHIM_FAILED, RECORD_NOT_WRITTEN})


class _Clock:
    """Milliseconds per stage, for the record."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.times[stage] = round((now - self._last) * 1e3, 3)
        self._last = now


def run(trigger: str) -> Issued | None:
    """The process's verdict, done and issued; None when TMAGUARD_MODE=off. Raises on the guard's own error
    (guard.py fails open around it) and GuardStop where a stop is asked for."""
    clock = _Clock()
    process = observe_process(DRIVER_LIBRARY, ENV_NAMES, ENV_PREFIXES)  # before the stages change anything
    environ = watched_environ(os.environ)
    with door.noting() as notes:
        toggles, toggle_problems = read_toggles(environ)
        if toggles.mode == "off":
            log("debug", "tmaguard: TMAGUARD_MODE=off, doing nothing")
            return None
        records = open_record_dir(toggles.record_dir)
        clock.lap("toggles")
        apply = toggles.mode == "auto"
        decided = decide(
            trigger, environ, toggles, toggle_problems, process, records, apply=apply, clock=clock
        )
        record, facts = decided.record, decided.facts
    issued = issue(record.to_json(), records.path, toggles.log_format)
    stop = stop_for(issued.document["problems"], toggles.strict, toggles.gemm)
    if stop:
        raise tell_kubernetes(stop)
    text = json.dumps(issued.document)
    if records.path and not records.refused and notes.steady and _replayable(issued.document, text, facts):
        with contextlib.suppress(Exception):  # not remembered: later processes run the full run too
            entry = _entry(process, notes, issued, text, record.actions, facts.driver.read_library_path)
            remember(records.path, entry)
    return issued


@value_type
class Decision:
    """What the stages found, planned and did, up to the typed record."""

    record: Record
    facts: Facts
    gpus: GpuFacts
    supply: SupplyPlan
    route: RoutePlan | None


# A vLLM server started here with vLLM's own settings: what `tmaguard check` and the doctor decide for, since
# neither sees the command line vLLM will be given.
SERVER_DEFAULTS: dict[str, Any] = {
    "eager": None,
    "launch": {"serve": True, "fraction": None, "kv_cache": None},
}


def decide(
    trigger: str,
    environ: dict[str, str],
    toggles: Toggles,
    toggle_problems: tuple[Problem, ...],
    process: dict[str, Any],
    records: RecordDir,
    *,
    apply: bool,
    clock: _Clock | None = None,
    vllm_dir: str | None = None,
) -> Decision:
    """The one decision script (docs/design.md §4), for the full run (apply: auto mode) and for `tmaguard
    check` and the doctor (apply False: the actions auto mode would take, nothing changed). `process`: its
    observation (verdict.observe_process), for what its command line tells vLLM; `records`: the private
    directory (path None: none, the overlay then in memory and the vLLM scan not cached)."""
    clock = clock or _Clock()
    facts = probe(
        environ, toggles.root, trigger, eager=process["eager"], vllm_dir=vllm_dir, cache_dir=records.path
    )
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
    memory, launched, launch_problems = (
        _launch(facts, toggles, process["launch"], apply) if route else (None, (), ())
    )
    clock.lap("routing")
    # What breaks vLLM first, then what concerns the guard's settings; without a GPU, no driver is none.
    unsupplied = () if not gpus.present and plan.status == "no-driver" else plan.problems
    problems = (
        *driver_problems(facts, gpus),  # the driver cannot run torch's and vLLM's CUDA: nothing works
        *_bypassed(facts), *layer_problems(facts.layers), *launch_problems, *unsupplied,
        *_root_problem(refused), *supply_problems,
        *routing_problems, *(route.problems if route else ()), *_probe_problems(facts),
        *filter(None, [writable_layer(facts.driver.path, facts.driver.resolution.how, toggles.root)]),
        *toggle_problems, *([records.problem()] if records.refused else []),
    )  # fmt: skip
    record = assemble(
        trigger,
        toggles.mode,
        facts,
        gpus,
        plan,
        route,
        supplied + routed + launched,
        problems,
        clock.times,
        memory,
    )
    return Decision(record, facts, gpus, plan, route)


def _launch(
    facts: Facts, toggles: Toggles, launch: dict[str, Any], apply: bool
) -> tuple[MemoryPlan, tuple[Action, ...], tuple[Problem, ...]]:
    """What vLLM is started with that the layer cannot take: its memory fraction under the layer's limit
    (memory.py), its compat switch under a layer that replaces libcuda.so.1 (compat.py); done where auto."""
    # A layer bypassed here or not loaded at all limits nothing (its LAYER_* problem says so).
    off = {BYPASSED, *NOT_IN_FORCE_CONDITIONS}
    loaded = tuple(layer for layer in facts.layers if not off & set(layer.conditions))
    names = frozenset(layer.name for layer in loaded)
    unenforced = tuple(layer.label for layer in memory_unlimited(loaded))
    flags = MemoryFlags(launch["fraction"], launch["kv_cache"], launch["serve"])
    limit = read_limit(facts.environ, toggles.root, names)
    portion = facts.environ.get(GIVEN_PORTION)
    memory = plan_memory(limit, flags, unenforced, toggles.memory, portion)
    compat = plan_compat(facts.environ, tuple((layer.name, layer.label) for layer in facts.layers), apply)
    args = ((FRACTION_FLAG, memory.set_to),) if memory.set_to else ()
    return memory, apply_launch(compat.env, args, apply), (*memory.problems, *compat.problems)


def _bypassed(facts: Facts) -> tuple[Problem, ...]:
    """A layer configured in the pod whose library is not this process's libcuda.so.1 (facts.py)."""
    return tuple(
        bypass_problem(LABELS["vcuda"], layer.evidence[0], facts.driver.path, facts.environ)
        for layer in facts.layers
        if BYPASSED in layer.conditions
    )


def _entry(
    process: dict[str, Any],
    notes: door.Notes,
    issued: Issued,
    text: str,
    actions: tuple[Action, ...],
    read_library_path: bool,
) -> dict[str, Any]:
    """The verdict as the cache keeps it, with what it was decided from (docs/design.md §4.1): the process,
    compared by LD_LIBRARY_PATH's value where the real driver's search read it, else by its effect on the
    loader's search; the files as the door noted them. `text`: the issued document as JSON."""
    compared = process if read_library_path else by_effect(process)
    shown = shown_variables(text, compared["env"], MIN_SECRET)
    secret = secret_values(shown)
    return {
        "process": compared,
        "files": notes.inputs(),
        "record": issued.document,
        "log_format": issued.log_format,
        "redo": replay_plan(actions),
        "secret_min": MIN_SECRET,
        # The variables whose values the record shows, judged no secret: a replay asks only of others.
        "shown": {name: value for name, value in shown.items() if value not in secret},
    }


def by_effect(process: dict[str, Any]) -> dict[str, Any]:
    """A process observation (verdict.observe_process) that compares LD_LIBRARY_PATH by its effect on the
    loader's search alone (library_path), for a verdict whose stages read nothing else of it."""
    names = [name for name in process["env_names"] if name != LIBRARY_PATH]
    env = {name: value for name, value in process["env"].items() if name != LIBRARY_PATH}
    return {**process, "env_names": names, "env": env}


def remember(directory: str, entry: dict[str, Any]) -> None:
    """Stores a full run's entry (_entry builds it) in the verdict cache (verdict.py), before the others it
    keeps; replaces a file it cannot read. Raises OSError (a failure only costs later processes their full
    run). Here, not in verdict.py: a replay never stores."""
    others = [e for e in load_entries(directory) if e["process"] != entry["process"]]
    document = {"format": CACHE_FORMAT, "tmaguard": __version__, "entries": [entry, *others][:ENTRIES_KEPT]}
    door.write_private(directory, CACHE_FILE, json.dumps(document).encode())


def _replayable(document: dict[str, Any], text: str, facts: Facts) -> bool:
    """A verdict other processes may replay: written, kept in a file (not in memory), no problem of this
    process alone (a preload entry this process's loader did not map, though its file would load: a later
    process of the same environment may have it), nothing redacted (what was depends on this process's
    secrets)."""
    in_memory = any(action["in_memory"] for action in document["actions"])
    own = any(problem["code"] in _OF_THIS_PROCESS for problem in document["problems"])
    unmapped = any(f.kind == NOT_LOADED for layer in facts.layers for f in layer.preload_faults)
    return (
        bool(document["record_file"])
        and not in_memory
        and not own
        and not unmapped
        and not shows_redaction(text)
    )


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
