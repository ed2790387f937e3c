"""Routing through vLLM's own knobs, checked with vLLM 0.32.0's real kernel selectors in fresh processes
(the pure routing function's own table: tests/unit/test_routing_plan.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_tmaguard.stages import ray_env
from vllm_tmaguard.stages.routing_table import TABLES, table_for

SELECTORS = (Path(__file__).parent / "versions" / "probe.py").read_text()  # vLLM's real selectors
GUARD_ONLY = "from vllm_tmaguard.guard import activate\nactivate('import-hook')\n"
H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "cc": "9.0"}
# The oracles below are read from vLLM 0.32.0's own sources (docs/research/vllm_tma_paths.md), not from the
# guard's routing table: a wrong table entry fails these tests instead of agreeing with itself.
# Linear kernels that encode no tensor map: Marlin's cp.async GEMMs (csrc/quantization/marlin), the FP8
# paths that call torch._scaled_mm (cuBLASLt), and Triton's.
NO_TMA = {
    "MarlinLinearKernel", "MarlinFP8ScaledMMLinearKernel", "PerTensorTorchFP8ScaledMMLinearKernel",
    "ChannelWiseTorchFP8ScaledMMLinearKernel", "RowWiseTorchFP8ScaledMMLinearKernel",
    "BlockWiseTorchFP8ScaledMMLinearKernel", "TritonFP8ScaledMMLinearKernel", "TritonFp8BlockScaledMMKernel",
}  # fmt: skip
# Built for sm_90a alone, and gated by vLLM to compute capability 9.0 exactly
# (quantization/kernels/mixed_precision/machete.py and cutlass.py: is_device_capability(90)).
SM90A_ONLY = {"MacheteLinearKernel", "CutlassW4A8LinearKernel"}


def selectors(run_python, pod, args: tuple[str, ...] = (), **env: str) -> tuple[dict, dict]:
    """vLLM's own kernel choices in a fresh process of `pod` (`args`: its command line), and its record."""
    run = run_python(pod, SELECTORS, env, args=args)
    result = run.result
    assert "error" not in result, run.stderr[-3000:]
    return result, run.record_of(result["pid"])


def families(record: dict) -> dict[str, str]:
    return {f["family"]: f["path"] for f in record["routing"]["families"]}


def test_h100_with_forwarded_encoder_keeps_machete_and_fa3(pods, run_python) -> None:
    result, record = selectors(run_python, pods("vcuda", **H100))
    assert result["w4a16"] == "MacheteLinearKernel"
    assert result["fa"] == 3
    assert result["fp8"] == "CutlassFP8ScaledMMLinearKernel"
    assert record["tma"]["usable"] is True
    assert families(record)["mixed-precision linear"] == "vLLM's choice: Machete (sm_90 TMA)"
    # The overlay forwards the encoder and adds cuLaunchKernelEx (Humming's launcher needs it): no steering.
    assert "VLLM_DISABLED_KERNELS" not in result["env"] and record["routing"]["env"] == {}


def test_h100_without_reachable_encoder_routes_everything_off_tma(pods, run_python) -> None:
    result, record = selectors(run_python, pods("lupine", **H100))
    assert result["w4a16"] == "MarlinLinearKernel"
    assert result["fa"] == 2
    assert {result["w4a16"], result["fp8"], result["fp8_block"]} <= NO_TMA
    assert result["env"]["VLLM_USE_DEEP_GEMM"] == "0" and result["env"]["VLLM_MOE_USE_DEEP_GEMM"] == "0"
    assert record["tma"]["usable"] is False
    assert families(record) == {
        "mixed-precision linear": "Marlin (cp.async)",
        "FP8/INT8 linear": "torch._scaled_mm (cuBLASLt) / Triton / Marlin FP8",
        "MoE": "Triton / Marlin MoE; DeepGEMM off",
        "attention": "FlashAttention-2",
    }
    assert any("--moe-backend marlin" in hint for hint in record["routing"]["hints"])


@pytest.mark.parametrize(
    ("name", "cc"), [("NVIDIA GeForce RTX 4090", "8.9"), ("NVIDIA GeForce RTX 5070", "12.0")]
)
def test_non_hopper_gets_marlin_and_no_sm90a_path(pods, run_python, name: str, cc: str) -> None:
    result, record = selectors(run_python, pods("vcuda", gpu_name=name, cc=cc))
    assert result["w4a16"] == "MarlinLinearKernel" and result["fa"] == 2
    assert {result["w4a16"], result["fp8"], result["fp8_block"]}.isdisjoint(SM90A_ONLY)
    mixed = next(f for f in record["routing"]["families"] if f["family"] == "mixed-precision linear")
    assert mixed["path"] == "Marlin (cp.async)"
    assert "vLLM limits Machete and CUTLASS W4A8 to compute capability 9.0" in mixed["why"]


# The guard alone, then the knobs vLLM's selectors read from the environment it leaves.
GUARD_THEN_ENV = GUARD_ONLY + (
    "import json, os\n"
    "env = {k: v for k, v in os.environ.items() if k.startswith('VLLM_')}\n"
    "print('RESULT ' + json.dumps({'pid': os.getpid(), 'env': env}))\n"
)


def test_user_disabled_kernels_survive_and_conflicting_setting_is_overridden(pods, run_python) -> None:
    """What the guard leaves in the environment for vLLM's selectors (the guard alone: that the selectors
    honour VLLM_DISABLED_KERNELS and VLLM_USE_DEEP_GEMM=0 on this pod is the test above)."""
    user = {"VLLM_DISABLED_KERNELS": "ExllamaLinearKernel, ConchLinearKernel", "VLLM_USE_DEEP_GEMM": "1"}
    run = run_python(pods("lupine", **H100), GUARD_THEN_ENV, user)
    result, record = run.result, run.record_of(run.result["pid"])
    disabled = result["env"]["VLLM_DISABLED_KERNELS"].split(",")
    assert disabled[:2] == ["ExllamaLinearKernel", "ConchLinearKernel"] and "MacheteLinearKernel" in disabled
    assert result["env"]["VLLM_USE_DEEP_GEMM"] == "0"
    (override,) = record["routing"]["overrides"]
    assert (override["variable"], override["was"], override["now"]) == ("VLLM_USE_DEEP_GEMM", "1", "0")
    assert override["why"]


def test_conflicting_setting_is_refused_in_strict_mode(pods, run_python) -> None:
    env = {"VLLM_USE_DEEP_GEMM": "1", "TMAGUARD_STRICT": "1"}
    run = run_python(pods("lupine", **H100), SELECTORS, env)
    assert run.returncode == 1 and "RESULT" not in run.stdout
    assert "stopped start-up: VLLM_USE_DEEP_GEMM=1 overridden to 0" in run.stderr


def test_gemm_latency_picks_marlin_for_w4a16_only(pods, run_python) -> None:
    result, _ = selectors(run_python, pods("bare", **H100), TMAGUARD_GEMM="latency")
    assert result["w4a16"] == "MarlinLinearKernel"
    assert result["fp8"] == "CutlassFP8ScaledMMLinearKernel" and result["fa"] == 3
    assert result["env"]["VLLM_DISABLED_KERNELS"] == "MacheteLinearKernel,HummingLinearKernel"


def test_gemm_portable_forces_cp_async_paths_even_with_an_encoder(pods, run_python) -> None:
    result, _ = selectors(run_python, pods("bare", **H100), TMAGUARD_GEMM="portable")
    assert result["w4a16"] == "MarlinLinearKernel" and result["fa"] == 2
    assert {result["fp8"], result["fp8_block"]} <= NO_TMA


def test_gemm_hopper_and_auto_keep_the_tma_path_on_a_complete_driver(pods, run_python) -> None:
    """The routing rule measured under `vllm serve` on an H100 (docs/e2e-on-hopper.md, "The routing rule"):
    Machete serves many requests faster than Marlin and one request slower, so `auto` keeps vLLM's Machete
    and FA3 wherever the encoder is real; Marlin only on request (`latency`, the test above). vLLM's
    selectors run under `auto`; under `hopper` the guard alone shows the same routing and actions, so what
    vLLM then sees is the same process (TMAGUARD_GEMM's own value aside, which vLLM never reads)."""
    pod = pods("bare", **H100)
    result, record = selectors(run_python, pod, TMAGUARD_GEMM="auto")
    assert result["w4a16"] == "MacheteLinearKernel" and result["fa"] == 3
    hopper = run_python(pod, GUARD_ONLY, {"TMAGUARD_GEMM": "hopper"}, records="hopper").last_record()
    for routed in (record, hopper):
        knobs = {k: v for k, v in routed["routing"]["env"].items() if k not in ray_env.ENV_NAMES}
        assert knobs == {} and routed["routing"]["error"] is None  # (a toggle set: carried to Ray workers)
    same = ("env", "blocked_imports", "disabled_kernels", "overrides")
    assert {k: hopper["routing"][k] for k in same} == {k: record["routing"][k] for k in same}
    assert hopper["actions"] == record["actions"] and hopper["problems"] == record["problems"] == []


def test_gemm_hopper_stops_start_up_when_tma_is_unusable(pods, run_python) -> None:
    run = run_python(pods("lupine", **H100), SELECTORS, {"TMAGUARD_GEMM": "hopper"})
    assert run.returncode == 1
    assert "TMAGUARD_GEMM=hopper insists on Hopper TMA kernels, but TMA is unusable: lupine" in run.stderr


def test_gemm_bad_value_names_it(pods, run_python) -> None:
    """The guard's own line (its activation as vLLM's import hook runs it; the selectors with the toggle at
    its default are test_gemm_hopper_and_auto_keep_the_tma_path_on_a_complete_driver's)."""
    run = run_python(pods("bare", **H100), GUARD_ONLY, {"TMAGUARD_GEMM": "fastest"})
    (line,) = run.guard_lines()
    assert "TMAGUARD_GEMM='fastest'" in line and "auto | hopper | portable | latency" in line


def test_table_matches_vllm_0_32_class_names(pods, run_python) -> None:
    table, note = table_for("0.32.0")
    assert note is None and table is TABLES[-1]
    code = (
        "import json, vllm.platforms as p; p.current_platform\n"
        "import vllm.model_executor.kernels.linear as linear\n"
        f"names = {list(table.kernels)!r}\n"
        "print('RESULT ' + json.dumps({n: isinstance(getattr(linear, n, None), type) for n in names}))\n"
    )
    run = run_python(pods("bare"), code)
    assert run.result == dict.fromkeys(table.kernels, True)
    assert run.last_record()["routing"]["stale"] == []
