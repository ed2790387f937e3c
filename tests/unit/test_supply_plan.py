"""What to supply, as a table: the pure planning step (supply.plan_supply) over typed facts, for each kind of
pod the design names (docs/design.md §2): what libcuda.so.1 lacks, which library supplies it, whether a real
encoder is reached, and the problems that stay."""

from __future__ import annotations

from typing import NamedTuple

import pytest
from facts_kit import REAL_DRIVER, VCUDA, driver, facts

from vllm_tmaguard import codes
from vllm_tmaguard.stages.layers import Layer
from vllm_tmaguard.stages.supply import plan_supply
from vllm_tmaguard.stages.toggles import Toggles

REAL = "/usr/local/nvidia/lib64/libcuda.so.580.159.04"
CONTROL = "/usr/local/nvidia/lib64/libcuda-control.so"
VCUDA_LAYER = (Layer("vcuda", ("libcuda.so.1 has SONAME libcuda-control.so",)),)
LUPINE = (Layer("lupine", ("env LUPINE_SERVER",), forwards_to_local_driver=False),)


class Case(NamedTuple):
    facts: object
    toggles: Toggles
    status: str
    supplies: tuple[tuple[str, tuple[str, ...]], ...]  # (library, fallback shims)
    encoder: bool
    problems: tuple[tuple[str, str | None], ...]  # (code, symbol)


TRIGGERS = ("cuTensorMapEncodeTiled", "cuGetProcAddress_v2", "cuLaunchKernelEx")
HANDLE_GAPS = (
    (codes.HANDLE_SCOPED_GAP, "cuGetProcAddress_v2"),
    (codes.HANDLE_SCOPED_GAP, "cuLaunchKernelEx"),
)
SHIMS = (("encoders", ()),)

CASES = {
    "bare driver": Case(facts(driver()), Toggles(), "complete", (), True, ()),
    "vCUDA, real driver beside it": Case(
        facts(driver(VCUDA, real_driver=REAL), VCUDA_LAYER), Toggles(), "lacking",
        (("overlay", ("encoders",)),), True, (),
    ),
    "vCUDA, no real driver file": Case(
        facts(driver(VCUDA), VCUDA_LAYER), Toggles(), "lacking", (("overlay", ("encoders",)),), False, (),
    ),
    "vCUDA, TMAGUARD_OVERLAY=off": Case(
        facts(driver(VCUDA, real_driver=REAL), VCUDA_LAYER), Toggles(overlay="off"), "lacking", SHIMS, True,
        HANDLE_GAPS,
    ),
    "vCUDA, libcuda.so.1 mapped before the guard": Case(
        facts(driver(VCUDA, how="mapped", real_driver=REAL), VCUDA_LAYER), Toggles(), "lacking", SHIMS, True,
        HANDLE_GAPS,
    ),
    "vCUDA lacking cuMemCreate, overlay off": Case(
        facts(driver(VCUDA - {"cuMemCreate"}, real_driver=REAL), VCUDA_LAYER), Toggles(overlay="off"),
        "lacking", SHIMS, True, (*HANDLE_GAPS, (codes.SYMBOL_UNSUPPLIED, "cuMemCreate")),
    ),
    "network layer": Case(
        facts(driver(VCUDA), LUPINE), Toggles(), "lacking", (("overlay", ("encoders",)),), False, ()
    ),
    "tmaguard's overlay in front of vCUDA": Case(
        facts(driver(VCUDA, overlay_of=CONTROL, real_driver=REAL), VCUDA_LAYER),
        Toggles(), "complete", (), True, (),
    ),
    "no libcuda.so.1": Case(
        facts(driver(path=None)), Toggles(), "no-driver", (), False, ((codes.DRIVER_MISSING, None),)
    ),
    "unreadable libcuda.so.1": Case(
        facts(driver(None, error="Permission denied")), Toggles(), "unreadable", (), False,
        ((codes.DRIVER_UNREADABLE, None),),
    ),
    "no vLLM": Case(facts(driver(VCUDA), VCUDA_LAYER, needs=None), Toggles(), "no-vllm", (), False, ()),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_plan(name: str) -> None:
    case = CASES[name]
    plan = plan_supply(case.facts, case.toggles)
    assert plan.status == case.status
    assert tuple((s.library, s.fallback) for s in plan.supplies) == case.supplies
    assert plan.encoder.reachable is case.encoder, plan.encoder.reason
    assert tuple((p.code, p.symbol) for p in plan.problems) == case.problems


def test_the_overlay_supplies_everything_lacking_and_the_triggers() -> None:
    plan = plan_supply(facts(driver(VCUDA, real_driver=REAL), VCUDA_LAYER), Toggles())
    (overlay,) = plan.supplies
    assert set(overlay.symbols) == set(plan.lacking) == {*TRIGGERS}
    assert plan.missing == {
        "cuTensorMapEncodeTiled": ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa3_C")
    }
    assert plan.launch_ex and plan.real_driver == REAL


def test_a_complete_driver_needs_nothing_whatever_vllm_needs() -> None:
    plan = plan_supply(facts(driver(REAL_DRIVER | {"cuFoo"})), Toggles())
    assert (plan.lacking, plan.supplies, plan.problems) == ((), (), ())
