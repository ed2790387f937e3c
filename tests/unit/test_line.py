"""The record's one line, rendered from its document's fields (issue.py): within the limit, the outcome
and the first problem's cause and fix always kept, the routing phrase and the record's place dropped first.
The case that surfaces later as CUBLAS_STATUS_NOT_INITIALIZED (shims where the overlay was needed) is the
worst one."""

from __future__ import annotations

import pytest
from facts_kit import REAL_DRIVER, VCUDA, driver, facts

from vllm_tmaguard.issue import MESSAGE_LIMIT, level_of, render
from vllm_tmaguard.stages.actions import apply_routing, apply_supply
from vllm_tmaguard.stages.gpu import Gpu, GpuFacts
from vllm_tmaguard.stages.layers import Layer
from vllm_tmaguard.stages.record import assemble
from vllm_tmaguard.stages.routing import plan_routing
from vllm_tmaguard.stages.runtime_cuda import CudaBuild, too_old
from vllm_tmaguard.stages.supply import plan_supply
from vllm_tmaguard.stages.toggles import Toggles

VCUDA_LAYER = (Layer("vcuda", ("libcuda.so.1 has SONAME libcuda-control.so",)),)
H100 = GpuFacts((Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0), "0000:18:00.0"),), "580.159.04", 13000)
REAL = "/usr/local/nvidia/lib64/libcuda.so.580.159.04"
LONG_PATH = "/usr/local/nvidia/lib64/" + "very-long-directory-name/" * 6 + "libcuda.so.1"


def record_of(pod, toggles: Toggles, gpus: GpuFacts = H100, record_file: str | None = None):
    plan = plan_supply(pod, toggles)
    supplied, supply_problems = apply_supply(plan.supplies, pod.driver.path or "", None, apply=False)
    route = plan_routing(
        gpus.capabilities(), gpus.cuda_driver_version, tuple(plan.encoder), plan.launch_ex, "0.32.0", None,
        toggles.gemm, {},
    )  # fmt: skip
    routed, _ = apply_routing(route.routing, apply=False)
    problems = (*plan.problems, *supply_problems, *route.problems)
    record = assemble("test", "validate", pod, gpus, plan, route, supplied + routed, problems, {})
    return record._replace(record_file=record_file)


CASES = {
    "bare": record_of(facts(driver(REAL_DRIVER)), Toggles()),
    "vCUDA, overlay": record_of(facts(driver(VCUDA, real_driver=REAL), VCUDA_LAYER), Toggles()),
    "vCUDA mapped before the guard, shims": record_of(
        facts(driver(VCUDA, how="mapped", path=LONG_PATH), VCUDA_LAYER), Toggles(),
        record_file="/tmp/tmaguard-1000680000/process-4242424.json",
    ),
    "vCUDA, overlay off, user insists on hopper": record_of(
        facts(driver(VCUDA - {"cuMemCreate"}, path=LONG_PATH), VCUDA_LAYER),
        Toggles(overlay="off", gemm="hopper"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_line_keeps_the_outcome_and_the_first_problems_cause_and_fix(name: str) -> None:
    record = CASES[name]
    line = render(record.to_json())
    assert len(line) <= MESSAGE_LIMIT, len(line)
    assert line.startswith(f"tmaguard: {record.summary[:60]}")
    if record.problems:
        first = record.problems[0]
        assert f"PROBLEM{f' ({len(record.problems)})' if len(record.problems) > 1 else ''}: " in line
        assert first.cause[:40] in line and f"fix: {first.fix[:60]}" in line
        assert level_of(record.to_json()) == "warning"
    else:
        assert level_of(record.to_json()) == "info" and "details: tmaguard doctor" in line


def test_the_shim_case_names_the_cause_and_the_fix() -> None:
    line = render(CASES["vCUDA mapped before the guard, shims"].to_json())
    assert "shims would be loaded (encoders)" in line
    assert "was already loaded when the guard ran" in line and "fix: put the overlay first" in line


def test_the_outcome_is_a_value() -> None:
    assert [CASES[name].outcome for name in CASES] == [
        "nothing-missing",
        "would-supply",
        "degraded",
        "degraded",
    ]


def test_the_doctors_text_keeps_its_line_breaks_and_escapes_the_rest() -> None:
    """A fix's manifest snippet spans lines: the readable report keeps them; a path's undecodable byte and a
    control character are escaped (at one point every line break came out as a literal \\n)."""
    from vllm_tmaguard.doctor.command import printable_strings

    snippet = "resources:\n  limits:\n    nvidia.com/gpu: 1"
    report = {"fix": [snippet, "/lib/\udcff\x1b[31m"]}
    assert printable_strings(report) == {"fix": [snippet, "/lib/\\xff\\x1b[31m"]}


def test_a_driver_too_old_leads_the_line_at_error_and_is_never_supplied() -> None:
    """vCUDA on an R535 node under CUDA 13 builds: what the layer lacks is supplied, yet vLLM cannot
    initialise CUDA. Without the problem the record says "supplied"; with it, degraded, at ERROR, the driver
    first."""
    pod, toggles = facts(driver(VCUDA, real_driver=REAL), VCUDA_LAYER), Toggles()
    old = GpuFacts(H100.gpus, "535.54.03", 12020)
    plan = plan_supply(pod, toggles)
    problem = too_old(old.driver_version, None, CudaBuild((13, 0), vllm=13), ("NVIDIA H100 80GB HBM3",))
    assert problem is not None
    actions = tuple(a._replace(applied=True) for a in record_of(pod, toggles, old).actions)  # as auto does

    def auto(problems: tuple) -> dict:
        return assemble("test", "auto", pod, old, plan, None, actions, problems, {}).to_json()

    healthy, broken = auto(()), auto((problem,))
    assert healthy["outcome"] == "supplied" and healthy["summary"].endswith("; supplied")
    assert broken["outcome"] == "degraded" and level_of(broken) == "error"
    assert "supplied" not in broken["summary"] and "driver too old" in broken["summary"]
    line = render(broken)
    assert "PROBLEM: NVIDIA driver 535.54.03 (up to CUDA 12.2)" in line and len(line) <= MESSAGE_LIMIT
    assert "fix: upgrade the node's NVIDIA driver to 580.65.06 or newer" in line
