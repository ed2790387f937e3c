"""stages/ray_env.py and ray_hook.runtime_env_hook: the toggles set in the head's environment carried
to the Ray workers of the job it starts (the runtime-env hook, added only where the user has none; vLLM's copy
list, added to, never replaced), the pod-local toggles left in each pod; route() asks for it wherever it
routes. The Ray cluster itself: tests/test_ray_workers.py."""

from __future__ import annotations

import pytest

from vllm_tmaguard import ray_hook
from vllm_tmaguard.stages import ray_env
from vllm_tmaguard.stages.routing import ENV_NAMES, plan_routing

HOOK = {"RAY_RUNTIME_ENV_HOOK": "vllm_tmaguard.ray_hook.runtime_env_hook"}


@pytest.mark.parametrize(
    ("environ", "changes"),
    [
        ({}, {}),
        ({"TMAGUARD_ROOT": "/pod", "TMAGUARD_RECORD_DIR": "/tmp/r", "TMAGUARD_WHEEL_SHA256": "ab"}, {}),
        ({"TMAGUARD_GEMM": "portable"}, {**HOOK, "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "TMAGUARD_GEMM"}),
        (
            {"TMAGUARD_MODE": "auto", "TMAGUARD_STRICT": "1", "TMAGUARD_ROOT": "/pod"},
            {**HOOK, "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "TMAGUARD_MODE,TMAGUARD_STRICT"},
        ),
        (  # the user's list kept first, in its order, and not repeated
            {"TMAGUARD_GEMM": "auto", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": " MY_VAR, TMAGUARD_GEMM "},
            HOOK,
        ),
        (
            {"TMAGUARD_GEMM": "auto", "TMAGUARD_TRACE": "1", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "MY_VAR"},
            {**HOOK, "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "MY_VAR,TMAGUARD_GEMM,TMAGUARD_TRACE"},
        ),
        (  # a hook of the user's own stays theirs
            {"TMAGUARD_GEMM": "auto", "RAY_RUNTIME_ENV_HOOK": "theirs.hook"},
            {"VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "TMAGUARD_GEMM"},
        ),
    ],
)
def test_carry(environ: dict, changes: dict) -> None:
    assert ray_env.carry(environ) == changes
    assert ray_env.carry({**environ, **changes}) == {}  # a later process of the pod changes nothing more


def test_the_carried_toggles_are_the_choices_not_the_pods_paths() -> None:
    assert ray_env.CARRIED == (
        "TMAGUARD_MODE", "TMAGUARD_STRICT", "TMAGUARD_GEMM", "TMAGUARD_MEMORY", "TMAGUARD_OVERLAY",
        "TMAGUARD_LOG_FORMAT", "TMAGUARD_TRACE",
    )  # fmt: skip


def test_route_carries_them_and_reads_them_as_inputs() -> None:
    """Where the guard routes (a driver and vLLM found), the variables are among its changes; both are verdict
    inputs (routing.ENV_NAMES), so a process that finds them set decides again."""
    environ = {"TMAGUARD_GEMM": "auto", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "MY_VAR"}
    plan = plan_routing(frozenset({(9, 0)}), 13000, (True, "exported"), True, "0.32.0", None, "auto", environ)
    assert plan.routing.env == {**HOOK, "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "MY_VAR,TMAGUARD_GEMM"}
    assert plan.problems == ()
    assert {"RAY_RUNTIME_ENV_HOOK", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"} <= set(ENV_NAMES)
    bare = plan_routing(frozenset({(9, 0)}), 13000, (True, "exported"), True, "0.32.0", None, "auto", {})
    assert bare.routing.env == {}


def test_the_runtime_env_hook_adds_the_toggles_the_job_does_not_set(monkeypatch) -> None:
    for name in ray_env.CARRIED:
        monkeypatch.delenv(name, raising=False)
    job = {"pip": ["x"], "env_vars": {"A": "1"}}
    assert ray_hook.runtime_env_hook(job) is job and ray_hook.runtime_env_hook(None) is None
    monkeypatch.setenv("TMAGUARD_GEMM", "portable")
    monkeypatch.setenv("TMAGUARD_MODE", "auto")
    monkeypatch.setenv("TMAGUARD_ROOT", "/head-pod")
    assert ray_hook.runtime_env_hook(None) == {
        "env_vars": {"TMAGUARD_MODE": "auto", "TMAGUARD_GEMM": "portable"}
    }
    ours = {"TMAGUARD_MODE": "auto", "TMAGUARD_GEMM": "portable"}
    assert ray_hook.runtime_env_hook(job) == {"pip": ["x"], "env_vars": {"A": "1", **ours}}
    assert job == {"pip": ["x"], "env_vars": {"A": "1"}}  # the caller's dict untouched
    given = {"env_vars": {"TMAGUARD_GEMM": "hopper"}}  # the job's own setting wins
    assert ray_hook.runtime_env_hook(given)["env_vars"]["TMAGUARD_GEMM"] == "hopper"
    broken = {"env_vars": ["not", "a", "mapping"]}
    assert ray_hook.runtime_env_hook(broken) is broken  # fails open: Ray reports its own error
