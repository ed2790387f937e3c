"""What the guard would find and do in a vLLM process started here, as its record, with nothing changed:
the same stages as guard._run in validate mode (for `tmaguard check` and `tmaguard doctor`)."""

from __future__ import annotations

from collections.abc import Mapping

from .actions import apply_routing, apply_supply
from .facts import Facts, probe
from .gpu import probe_gpus
from .record import Record, assemble
from .routing import RoutePlan, plan_routing
from .supply import SupplyPlan, plan_supply
from .toggles import Toggles


def plan(facts: Facts, toggles: Toggles, root: str) -> tuple[SupplyPlan, RoutePlan | None]:
    """The guard's two plans for these facts (pure but for the GPUs' files)."""
    supply = plan_supply(facts, toggles)
    if supply.status not in ("complete", "lacking"):
        return supply, None
    gpus = probe_gpus(root)
    route = plan_routing(
        gpus.capabilities(), gpus.cuda_driver_version, (supply.encoder.reachable, supply.encoder.reason),
        supply.launch_ex, facts.vllm.version, facts.kernels_listed, toggles.gemm, facts.environ,
    )  # fmt: skip
    return supply, route


def preview(
    environ: Mapping[str, str], toggles: Toggles, trigger: str, vllm_dir: str | None = None
) -> Record:
    facts = probe(environ, toggles.root, trigger, vllm_dir=vllm_dir)
    supply, route = plan(facts, toggles, toggles.root)
    supplied, supply_problems = apply_supply(supply.supplies, facts.driver.path or "", None, apply=False)
    routed, routing_problems = apply_routing(route.routing, apply=False) if route else ((), ())
    problems = (*supply.problems, *supply_problems, *routing_problems, *(route.problems if route else ()))
    gpus = probe_gpus(toggles.root)
    return assemble(trigger, "validate", facts, gpus, supply, route, supplied + routed, problems, {})
