"""The pure routing step as tables of scenarios: the TMA verdict (GPU, driver, encoder) and route() over the
installed vLLM's kernel table, the user's settings and TMAGUARD_GEMM."""

from __future__ import annotations

import pytest

from vllm_tmaguard.stages.routing import RoutingInputs, plan_routing, route, tma_verdict
from vllm_tmaguard.stages.routing_table import TABLES, table_for

HOPPER, ADA, BLACKWELL = (9, 0), (8, 9), (10, 0)
ENCODER = (True, "libcuda.so.1 exports cuTensorMapEncodeTiled")
NO_ENCODER = (False, "libcuda.so.1 lacks cuTensorMapEncodeTiled")


@pytest.mark.parametrize(
    ("capabilities", "cuda", "encoder", "usable"),
    [
        ({HOPPER}, 13000, ENCODER, True),
        ({HOPPER}, 13000, NO_ENCODER, False),
        ({HOPPER}, 11080, ENCODER, False),  # a CUDA 11 driver: no TMA
        ({ADA}, 13000, ENCODER, False),
        ({BLACKWELL}, 13000, ENCODER, False),  # sm_100 runs its own kernels, not sm_90's TMA ones
        ({HOPPER, ADA}, 13000, ENCODER, True),
        (set(), None, ENCODER, True),  # unknown GPU and driver: the encoder decides
        (set(), None, NO_ENCODER, False),
    ],
)
def test_tma_verdict(capabilities: set, cuda: int | None, encoder: tuple[bool, str], usable: bool) -> None:
    verdict = tma_verdict(frozenset(capabilities), cuda, encoder)
    assert verdict.usable is usable and verdict.reason


@pytest.mark.parametrize(
    ("gemm", "encoder", "disabled"),
    [
        ("auto", ENCODER, set()),
        ("auto", NO_ENCODER, {"MacheteLinearKernel", "CutlassFP8ScaledMMLinearKernel"}),
        ("portable", ENCODER, {"MacheteLinearKernel", "CutlassFP8ScaledMMLinearKernel"}),
        ("hopper", ENCODER, set()),
    ],
)
def test_plan_on_hopper_by_gemm_toggle_and_encoder(
    gemm: str, encoder: tuple[bool, str], disabled: set
) -> None:
    plan = plan_routing(frozenset({HOPPER}), 13000, encoder, True, "0.32.0", None, gemm, {})
    off = set(filter(None, plan.routing.env.get("VLLM_DISABLED_KERNELS", "").split(",")))
    assert disabled <= off and (off == set()) is (disabled == set()), off
    assert plan.problems == ()


def test_hopper_insisted_on_without_tma_is_a_problem_that_stops_start_up() -> None:
    plan = plan_routing(frozenset({HOPPER}), 13000, NO_ENCODER, True, "0.32.0", None, "hopper", {})
    assert [p.code for p in plan.problems] == ["routing-impossible"]


def test_a_user_setting_overridden_is_a_problem_naming_the_variable() -> None:
    plan = plan_routing(
        frozenset({HOPPER}), 13000, NO_ENCODER, True, "0.32.0", None, "auto", {"VLLM_USE_DEEP_GEMM": "1"}
    )
    assert [(p.code, p.subject) for p in plan.problems] == [("routing-override", "VLLM_USE_DEEP_GEMM")]
    assert plan.routing.env["VLLM_USE_DEEP_GEMM"] == "0"


# The pure function, as a table of scenarios.
def _inputs(**overrides) -> RoutingInputs:
    base = dict(
        table=TABLES[-1],
        version_note=None,
        vllm_version="0.32.0",
        capabilities=frozenset({(9, 0)}),
        encoder_reachable=True,
        encoder_reason="exported",
        tma_usable=True,
        tma_reason="exported",
        launch_ex=True,
        gemm="auto",
        listed=frozenset(TABLES[-1].kernels),
        environ={},
    )
    base.update(overrides)
    return RoutingInputs(**base)


def test_old_vllm_without_exact_gate_disables_machete_on_blackwell() -> None:
    table, _ = table_for("0.6.6.post1")
    routing = route(
        _inputs(
            table=table,
            vllm_version="0.6.6.post1",
            capabilities=frozenset({(12, 0)}),
            listed=frozenset(table.kernels),
        )
    )
    assert routing.env == {"VLLM_DISABLED_KERNELS": "MacheteLinearKernel"}
    assert "does not limit it to compute capability 9.0" in routing.disabled[0][1]


def test_unknown_gpu_and_no_encoder_routes_conservatively() -> None:
    routing = route(_inputs(capabilities=frozenset(), encoder_reachable=False, tma_usable=False))
    assert "MacheteLinearKernel" in routing.env["VLLM_DISABLED_KERNELS"]
    assert "vllm.vllm_flash_attn._vllm_fa3_C" in routing.block_modules


def test_humming_is_disabled_where_cuLaunchKernelEx_is_missing() -> None:
    routing = route(_inputs(launch_ex=False))
    assert routing.env == {
        "VLLM_DISABLED_KERNELS": ",".join(
            ["HummingLinearKernel", "HummingFP8ScaledMMLinearKernel", "HummingInt8ScaledMMLinearKernel"]
        )
    }


def test_old_vllm_flash_attn_env_is_overridden() -> None:
    table, _ = table_for("0.10.2")
    routing = route(
        _inputs(
            table=table,
            encoder_reachable=False,
            tma_usable=False,
            environ={"VLLM_FLASH_ATTN_VERSION": "3"},
            listed=frozenset(table.kernels),
        )
    )
    assert routing.env["VLLM_FLASH_ATTN_VERSION"] == "2"
    (override,) = routing.overrides
    assert (override.variable, override.was, override.now) == ("VLLM_FLASH_ATTN_VERSION", "3", "2")


def test_stale_names_and_unread_versions_are_reported_not_fatal() -> None:
    routing = route(_inputs(listed=frozenset({"MacheteLinearKernel"}), version_note="vLLM 0.40.0 is newer"))
    assert routing.stale[0] == "vLLM 0.40.0 is newer"
    assert any(s.startswith("CutlassW4A8LinearKernel is not listed") for s in routing.stale)
    assert table_for("0.40.0")[1] and table_for("0.5.0")[1] and table_for(None)[1]
