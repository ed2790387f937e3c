"""The one record per process: a typed value built from the stages' outputs, converted to JSON only where
it is issued (to_json, schema 2: issue.py writes it and renders the log line from its fields;
docs/design.md §4). What a record file must look like to be read back (the doctor, `tmaguard record`):
record_shape.py."""

import os
import time
from collections.abc import Mapping
from typing import Any

from .. import __version__, codes
from ..codes import COMPLETE, DEGRADED, NO_GPU, NO_VLLM, SUPPLIED, WOULD_SUPPLY
from ..redaction import redact
from .metering import metering_json
from .outcomes import Action, Problem
from .values import value_type

TYPE_CHECKING = False
if TYPE_CHECKING:  # the stages' types, for annotations only: importing them here would cost start-up
    from .facts import Facts
    from .gpu import GpuFacts
    from .memory import MemoryPlan
    from .routing import RoutePlan
    from .supply import SupplyPlan

SCHEMA = 2


@value_type
class Record:
    pid: int
    time: str
    trigger: str
    mode: str
    outcome: str
    layers: tuple[dict[str, Any], ...]  # name, label, evidence
    libcuda: dict[str, Any]
    gpu: dict[str, Any]
    vllm: dict[str, Any]
    lacking: tuple[str, ...]
    missing: dict[str, list[str]]  # vLLM's needs libcuda.so.1 lacks
    supplied: dict[str, str]  # symbol -> library
    encoder: dict[str, Any] | None  # reachable, reason
    tma: dict[str, Any] | None  # usable, reason
    routing: dict[str, Any] | None
    actions: tuple[Action, ...]
    problems: tuple[Problem, ...]
    timings_ms: dict[str, float]
    elapsed_ms: float = 0.0
    record_file: str | None = None
    forked_from: int | None = None
    replayed_from: int | None = None  # the process whose verdict this one replayed (verdict.py)
    tmaguard: str = __version__
    replaced: Mapping[str, str] = {}  # the layer's own exports answered instead by the guard's library
    metering: tuple[dict[str, Any], ...] = ()  # per layer: what it meters (metering.metering_json)
    memory: dict[str, Any] | None = None  # the layer's limit and vLLM's share of it (memory.MemoryPlan)
    layer_files: tuple[dict[str, Any], ...] = ()  # per layer: its library file and which build it is

    @property
    def layer(self) -> dict[str, Any] | None:
        return self.layers[0] if self.layers else None

    @property
    def summary(self) -> str:
        """The outcome in a sentence, for people (nothing reads it back)."""
        who = self.layer["label"] if self.layer else "no sharing layer"
        if self.libcuda.get("overlay_of"):
            who += " behind tmaguard's overlay"
        if self.outcome == NO_GPU:
            return "no GPU and no libcuda.so.1: nothing to do"
        if self.outcome == NO_VLLM:
            return f"{who}: vLLM is not installed, nothing to check"
        if any(p.code == codes.DRIVER_TOO_OLD for p in self.problems):  # whatever was supplied, vLLM fails
            return f"{who}: driver too old for vLLM's CUDA runtime, CUDA cannot initialise"
        headline = next((_HEADLINES[p.code] for p in self.problems if p.code in _HEADLINES), None)
        if headline:  # what breaks vLLM on this pod before any missing symbol does
            return f"{who}: {headline}"
        taken = self.outcome == SUPPLIED and all(a.applied for a in self.actions)  # not `tmaguard check`'s
        if not self.lacking and self.replaced:
            verb = "the overlay answers" if taken else "the overlay would answer"
            return f"{who}: its look-ups hand out legacy ABIs; {verb} them"
        if not self.lacking:
            first = next((p for p in self.problems if p.code.startswith("driver")), None)
            return f"{who}: {first.cause}" if first else f"{who}: libcuda.so.1 has every entry point needed"
        more = f" and {len(self.lacking) - 1} more" if len(self.lacking) > 1 else ""
        verbs = {SUPPLIED: "supplied" if taken else "would be supplied", WOULD_SUPPLY: "would be supplied"}
        verb = verbs.get(self.outcome, "not all supplied")
        return f"{who}: libcuda.so.1 lacks {self.lacking[0]}{more}; {verb}"

    def to_json(self) -> dict[str, Any]:
        """The record as written and logged, secrets redacted (trust.py)."""
        document = {
            "schema": SCHEMA,
            "tmaguard": self.tmaguard,
            "pid": self.pid,
            "time": self.time,
            "trigger": self.trigger,
            "mode": self.mode,
            "outcome": self.outcome,
            "summary": self.summary,
            "layers": list(self.layers),
            "libcuda": self.libcuda,
            "gpu": self.gpu,
            "vllm": self.vllm,
            "lacking": list(self.lacking),
            "missing": self.missing,
            "supplied": self.supplied,
            "replaced": dict(self.replaced),
            "encoder": self.encoder,
            "tma": self.tma,
            "routing": self.routing,
            "actions": [a.to_json() for a in self.actions],
            "problems": [p.to_json() for p in self.problems],
            "timings_ms": self.timings_ms,
            "elapsed_ms": self.elapsed_ms,
            "record_file": self.record_file,
            "forked_from": self.forked_from,
            "replayed_from": self.replayed_from,
            "metering": list(self.metering),
            "memory": self.memory,
            "layer_files": list(self.layer_files),
        }
        return redact(document)


# Problems the summary leads with, in a phrase each: vLLM fails here whatever libcuda.so.1 exports.
_HEADLINES = {
    codes.LAYER_NOT_IN_FORCE: "configured but NOT in force (not loaded): no quota, no limit",
    codes.LAYER_BYPASSED: "its quota is not in force in this process",
    codes.MEMORY_FRACTION_TOO_HIGH: "vLLM's memory share does not fit the layer's limit",
}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# Problems that leave vLLM worse off than a complete driver would (the others concern the guard itself).
_DEGRADING = frozenset(
    {
        codes.DRIVER_MISSING, codes.DRIVER_UNREADABLE, codes.SYMBOL_UNSUPPLIED, codes.HANDLE_SCOPED_GAP,
        codes.OVERLAY_FAILED, codes.SHIM_FAILED, codes.ROOT_REFUSED, codes.IMPORTED_EARLY,
        codes.EXTENSION_UNREADABLE, codes.LAYER_NOT_IN_FORCE, *codes.CUDA_BROKEN,
    }
)  # fmt: skip


def outcome_of(
    facts: "Facts", gpus: "GpuFacts", plan: "SupplyPlan", problems: tuple[Problem, ...], apply: bool
) -> str:
    if not gpus.present and facts.driver.path is None:
        return NO_GPU
    if plan.status == "no-vllm":
        return NO_VLLM
    if any(p.code in _DEGRADING for p in problems):
        return DEGRADED
    if plan.lacking or plan.replaced:
        return SUPPLIED if apply else WOULD_SUPPLY
    return COMPLETE


def assemble(
    trigger: str,
    mode: str,
    facts: "Facts",
    gpus: "GpuFacts",
    plan: "SupplyPlan",
    route: "RoutePlan | None",
    actions: tuple[Action, ...],
    problems: tuple[Problem, ...],
    timings_ms: dict[str, float],
    memory: "MemoryPlan | None" = None,
) -> Record:
    """The record of one activation, from the stages' outputs."""
    driver, routing = facts.driver, route.routing if route else None
    return Record(
        pid=os.getpid(),
        time=now(),
        trigger=trigger,
        mode=mode,
        outcome=outcome_of(facts, gpus, plan, problems, mode == "auto"),
        layers=tuple(
            {
                "name": layer.name,
                "label": layer.label,
                "evidence": list(layer.evidence),
                "remote": not layer.forwards_to_local_driver,
                "conditions": list(layer.conditions),
            }
            for layer in facts.layers
        ),
        libcuda={
            "path": driver.path,
            "how": driver.resolution.how,
            "soname": driver.info.soname if driver.info else None,
            "mapped": list(driver.resolution.mapped),
            "real_driver": driver.real_driver,
            "overlay_of": driver.overlay_of,
            "module_version": driver.module_version,
            "error": driver.error,
        },
        gpu={
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "compute_capability": "{}.{}".format(*g.compute_capability)
                    if g.compute_capability
                    else None,
                    "bus_id": g.bus_id,
                }
                for g in gpus.gpus
            ],
            "driver_version": gpus.driver_version,
            "cuda_driver_version": gpus.cuda_driver_version,
            "source": gpus.source,
            "error": gpus.error,
        },
        vllm={
            "version": facts.vllm.version,
            "found": facts.vllm.found,
            "platform_plugins": facts.vllm.platform_plugins,
        },
        lacking=plan.lacking,
        missing={symbol: list(modules) for symbol, modules in (plan.missing or {}).items()},
        supplied=plan.supplied,
        replaced=dict.fromkeys(plan.replaced, "overlay"),
        metering=tuple(metering_json(facts.layers)),
        layer_files=tuple(
            {"layer": layer.name, **layer.library._asdict(), "versions": list(layer.library.versions)}
            for layer in facts.layers
            if layer.library is not None
        ),
        encoder={"reachable": plan.encoder.reachable, "reason": plan.encoder.reason},
        tma=None if route is None else {"usable": route.tma.usable, "reason": route.tma.reason},
        routing=None if routing is None else _routing_json(routing, _launch_overrides(actions, memory)),
        actions=actions,
        problems=problems,
        timings_ms=timings_ms,
        elapsed_ms=round(sum(timings_ms.values()), 2),
        memory=memory.to_json() if memory else None,
    )


def _launch_overrides(actions: tuple[Action, ...], memory: "MemoryPlan | None") -> list[dict[str, Any]]:
    """What the guard changed of how vLLM is started (memory.py, compat.py), as routing overrides."""
    from .compat import SWITCH
    from .memory import FRACTION_FLAG, VLLM_DEFAULT_FRACTION

    found = []
    for action in actions:
        if action.kind == codes.SET_ARG and action.target == FRACTION_FLAG and memory and memory.limit:
            found.append(
                {
                    "variable": FRACTION_FLAG,
                    "was": f"{VLLM_DEFAULT_FRACTION} (vLLM's default)",
                    "now": action.value,
                    "why": f"vLLM's default leaves too little of the layer's limit ({memory.limit.source}) "
                    "for its CUDA context and graphs",
                }
            )
        elif action.kind == codes.SET_ENV and action.target == SWITCH:
            found.append(
                {
                    "variable": SWITCH,
                    "was": "1",
                    "now": action.value,
                    "why": "a compat libcuda.so.1 first on the path bypasses the layer in vLLM's children",
                }
            )
    return found


def _routing_json(routing: Any, launch_overrides: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "families": [{"family": f.family, "path": f.path, "why": f.why} for f in routing.families],
        "env": routing.env,
        "blocked_imports": list(routing.block_modules),
        "disabled_kernels": [{"kernel": name, "why": why} for name, why in routing.disabled],
        "overrides": [
            *({"variable": o.variable, "was": o.was, "now": o.now, "why": o.why} for o in routing.overrides),
            *launch_overrides,
        ],
        "hints": list(routing.hints),
        "stale": list(routing.stale),
        "error": routing.error,
    }
