"""What the guard would find and do in a vLLM process started here, as its record, with nothing changed:
the same stages as pipeline.run in validate mode (for `tmaguard check` and `tmaguard doctor`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from .actions import apply_routing, apply_supply
from .facts import Facts, probe
from .gpu import GpuFacts, probe_gpus
from .metering import layer_problems
from .record import Record, assemble
from .routing import RoutePlan, plan_routing_after
from .runtime_cuda import driver_problems
from .supply import SupplyPlan, plan_supply
from .toggles import Toggles


class Preview(NamedTuple):
    """What the guard would see and decide here: its inputs and plans, and the record it would write."""

    facts: Facts
    gpus: GpuFacts
    supply: SupplyPlan
    route: RoutePlan | None
    record: Record


def preview_all(
    environ: Mapping[str, str], toggles: Toggles, trigger: str, vllm_dir: str | None = None
) -> Preview:
    facts = probe(environ, toggles.root, trigger, eager=None, vllm_dir=vllm_dir)  # not vLLM's argv
    gpus = probe_gpus(toggles.root)
    supply = plan_supply(facts, toggles)
    route = plan_routing_after(facts, gpus, supply, toggles.gemm)
    supplied, supply_problems = apply_supply(supply.supplies, facts.driver.path or "", None, apply=False)
    routed, routing_problems = apply_routing(route.routing, apply=False) if route else ((), ())
    problems = (
        *driver_problems(facts, gpus),  # the driver cannot run torch's and vLLM's CUDA: nothing works
        *layer_problems(facts.layers), *supply.problems, *supply_problems, *routing_problems,
        *(route.problems if route else ()),
    )  # fmt: skip
    record = assemble(trigger, "validate", facts, gpus, supply, route, supplied + routed, problems, {})
    return Preview(facts, gpus, supply, route, record)


def preview(
    environ: Mapping[str, str], toggles: Toggles, trigger: str, vllm_dir: str | None = None
) -> Record:
    return preview_all(environ, toggles, trigger, vllm_dir).record
