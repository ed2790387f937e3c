"""The one record per process: a typed value built from the stages' outputs, converted to JSON only at the
edge (to_json, schema 2), and the one log line rendered from its fields in vLLM's style (docs/design.md §4).
`tmaguard doctor` reads it back with from_json."""

from __future__ import annotations

import os
import time
from typing import Any, NamedTuple

from . import __version__, codes
from .codes import LOAD_OVERLAY, LOAD_SHIM
from .outcomes import Action, Problem
from .redaction import redact
from .verdict import MESSAGE_LIMIT, clip, details, fit_line

TYPE_CHECKING = False
if TYPE_CHECKING:  # the stages' types, for annotations only: importing them here would cost start-up
    from .facts import Facts
    from .gpu import GpuFacts
    from .routing import RoutePlan
    from .supply import SupplyPlan

SCHEMA = 2

# Outcome values: what an operator filters on (and fleet metrics count).
NO_GPU = "no-gpu"  # no GPU and no libcuda.so.1: nothing to do
COMPLETE = "nothing-missing"  # libcuda.so.1 has everything vLLM and its libraries need
SUPPLIED = "supplied"  # what it lacks was supplied
WOULD_SUPPLY = "would-supply"  # validate mode: what auto would supply
DEGRADED = "degraded"  # something stays broken (see problems)
NO_VLLM = "no-vllm"


class Record(NamedTuple):
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
        if not self.lacking:
            first = next((p for p in self.problems if p.code.startswith("driver")), None)
            return f"{who}: {first.cause}" if first else f"{who}: libcuda.so.1 has every entry point needed"
        more = f" and {len(self.lacking) - 1} more" if len(self.lacking) > 1 else ""
        verb = {SUPPLIED: "supplied", WOULD_SUPPLY: "would be supplied"}.get(self.outcome, "not all supplied")
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
        }
        return redact(document)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        """A record as written (schema 2). Raises KeyError or TypeError for something else."""
        if data.get("schema") != SCHEMA:
            raise KeyError(f"record schema {data.get('schema')!r}, not {SCHEMA}")
        return cls(
            pid=data["pid"],
            time=data["time"],
            trigger=data["trigger"],
            mode=data["mode"],
            outcome=data["outcome"],
            layers=tuple(data["layers"]),
            libcuda=data["libcuda"],
            gpu=data["gpu"],
            vllm=data["vllm"],
            lacking=tuple(data["lacking"]),
            missing=data["missing"],
            supplied=data["supplied"],
            encoder=data["encoder"],
            tma=data["tma"],
            routing=data["routing"],
            actions=tuple(Action.from_json(a) for a in data["actions"]),
            problems=tuple(Problem.from_json(p) for p in data["problems"]),
            timings_ms=data.get("timings_ms", {}),
            elapsed_ms=data.get("elapsed_ms", 0.0),
            record_file=data.get("record_file"),
            forked_from=data.get("forked_from"),
            replayed_from=data.get("replayed_from"),
            tmaguard=data.get("tmaguard", "?"),
        )


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# Problems that leave vLLM worse off than a complete driver would (the others concern the guard itself).
_DEGRADING = frozenset(
    {
        codes.DRIVER_MISSING, codes.DRIVER_UNREADABLE, codes.SYMBOL_UNSUPPLIED, codes.HANDLE_SCOPED_GAP,
        codes.OVERLAY_FAILED, codes.SHIM_FAILED, codes.ROOT_REFUSED, codes.IMPORTED_EARLY,
        codes.EXTENSION_UNREADABLE,
    }
)  # fmt: skip


def outcome_of(
    facts: Facts, gpus: GpuFacts, plan: SupplyPlan, problems: tuple[Problem, ...], apply: bool
) -> str:
    if not gpus.present and facts.driver.path is None:
        return NO_GPU
    if plan.status == "no-vllm":
        return NO_VLLM
    if any(p.code in _DEGRADING for p in problems):
        return DEGRADED
    if plan.lacking:
        return SUPPLIED if apply else WOULD_SUPPLY
    return COMPLETE


def assemble(
    trigger: str,
    mode: str,
    facts: Facts,
    gpus: GpuFacts,
    plan: SupplyPlan,
    route: RoutePlan | None,
    actions: tuple[Action, ...],
    problems: tuple[Problem, ...],
    timings_ms: dict[str, float],
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
        encoder={"reachable": plan.encoder.reachable, "reason": plan.encoder.reason},
        tma=None if route is None else {"usable": route.tma.usable, "reason": route.tma.reason},
        routing=None if routing is None else _routing_json(routing),
        actions=actions,
        problems=problems,
        timings_ms=timings_ms,
        elapsed_ms=round(sum(timings_ms.values()), 2),
    )


def _routing_json(routing: Any) -> dict[str, Any]:
    return {
        "families": [{"family": f.family, "path": f.path, "why": f.why} for f in routing.families],
        "env": routing.env,
        "blocked_imports": list(routing.block_modules),
        "disabled_kernels": [{"kernel": name, "why": why} for name, why in routing.disabled],
        "overrides": [
            {"variable": o.variable, "was": o.was, "now": o.now, "why": o.why} for o in routing.overrides
        ],
        "hints": list(routing.hints),
        "stale": list(routing.stale),
        "error": routing.error,
    }


# ---------------------------------------------------------------------------------------------------------
# The log line


def level_of(record: Record) -> str:
    """warning: a problem (a bad toggle too, even on a machine without a GPU) or a path no knob reaches;
    debug: nothing to do here; else info."""
    hints = bool(record.routing and record.routing.get("hints"))
    if record.problems or hints:
        return "warning"
    return "debug" if record.outcome == NO_GPU else "info"


def line_parts(record: Record) -> tuple[list[str], list[str]]:
    """The log line's parts from the record's fields, redacted, for log.fit_line: the essential ones (the
    outcome, what was loaded, the first problem's cause, given whatever room the rest leaves it, and its
    fix) and the optional ones in the order they are dropped last (the routing in a phrase). The record's
    place, which differs per process, is log.details'."""
    head = f"tmaguard: {clip(record.summary, 100)}"
    loaded = _loaded(record.actions)
    essential = [head, *([loaded] if loaded else [])]
    if record.problems:
        first = record.problems[0]
        count = f" ({len(record.problems)})" if len(record.problems) > 1 else ""
        fix = f"fix: {clip(first.fix, 110)}"
        label = f"PROBLEM{count}: "
        room = MESSAGE_LIMIT - sum(len(p) + 2 for p in essential) - len(label) - len(fix) - 2
        essential += [label + clip(first.cause, max(room, 40)), fix]
    optional = [part for part in (_routing_phrase(record.routing, record.tma),) if part]
    return [redact(p) for p in essential], [redact(p) for p in optional]


def render_line(record: Record) -> str:
    """The whole line, as logged: the outcome and the first problem always stay; the routing and the
    record's place go first."""
    essential, optional = line_parts(record)
    return fit_line(essential, [*optional, details(record.record_file)])


def _loaded(actions: tuple[Action, ...]) -> str | None:
    overlay = [a for a in actions if a.kind == LOAD_OVERLAY]
    shims = [a.target for a in actions if a.kind == LOAD_SHIM]
    parts = []
    if overlay:
        where = " (in memory)" if overlay[0].in_memory else ""
        parts.append(f"overlay {'loaded' if overlay[0].applied else 'would be loaded'}{where}")
    if shims:
        parts.append(f"shims {'loaded' if actions[0].applied else 'would be loaded'} ({', '.join(shims)})")
    return "; ".join(parts) or None


def _routing_phrase(routing: dict[str, Any] | None, tma: dict[str, Any] | None) -> str | None:
    if routing is None:
        return None
    changes = []
    if routing["disabled_kernels"]:
        changes.append(f"{len(routing['disabled_kernels'])} kernels off")
    if any(name.endswith("USE_DEEP_GEMM") for name in routing["env"]):
        changes.append("DeepGEMM off")
    if routing["blocked_imports"]:
        changes.append(f"{len(routing['blocked_imports'])} extensions blocked")
    if not changes:
        changes.append("vLLM's own choices" + (", TMA kept" if tma and tma["usable"] else ""))
    counted = {"hint": routing["hints"], "note": routing["stale"]}
    notes = [f"{len(items)} {what}{'s' * (len(items) > 1)}" for what, items in counted.items() if items]
    return "routing: " + ", ".join(changes + notes)
