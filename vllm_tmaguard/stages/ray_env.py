"""The guard's toggles carried to vLLM's Ray workers (docs/design.md §3.4). A Ray worker is an actor the
raylet of its node starts: it inherits that node's (pod's) environment, not the head's `os.environ`, and
imports vLLM, so runs its guard, as it is created, before vLLM's executor copies anything to it (vLLM
0.32.0: RayDistributedExecutor's `update_environment_variables` after the actors exist). What reaches a
worker process before its first import is its job's runtime env: Ray's driver-side hook
(`RAY_RUNTIME_ENV_HOOK`, called by `ray.init` in the process that starts the job, vLLM's engine) may add to
it, and ray_hook.runtime_env_hook adds the toggles set in the head's environment. vLLM's own copy gets their
names too (`VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`, added to the user's list): the workers' environment then says
what their guard decided with. The pod-local toggles (TMAGUARD_ROOT, TMAGUARD_RECORD_DIR, the init
container's pin) are each pod's own and stay there. Pure: the variables to set, from the environment."""

from __future__ import annotations

from collections.abc import Mapping

from .toggles import TOGGLES

HOOK_VARIABLE = "RAY_RUNTIME_ENV_HOOK"
HOOK = "vllm_tmaguard.ray_hook.runtime_env_hook"
COPY_VARIABLE = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"
# The toggles that say how the guard behaves (a choice among values): the same on every node of a job.
CARRIED = tuple(spec.name for spec in TOGGLES if spec.kind == "choice")
ENV_NAMES = (HOOK_VARIABLE, COPY_VARIABLE)


def carried(environ: Mapping[str, str]) -> dict[str, str]:
    """The toggles of `environ` that Ray workers are to get."""
    return {name: environ[name] for name in CARRIED if name in environ}


def _merged(listed: str, names: list[str]) -> str | None:
    """The user's comma-separated names followed by those of `names` not listed; None if none is added."""
    user = [name.strip() for name in listed.split(",") if name.strip()]
    added = [name for name in names if name not in user]
    return ",".join(user + added) if added else None


def carry(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that carry this process's toggles to the Ray workers of a job it starts: none when it
    sets no toggle; a runtime-env hook already set (the user's) is left as it is."""
    names = list(carried(environ))
    if not names:
        return {}
    changes = {}
    if not environ.get(HOOK_VARIABLE, "").strip():
        changes[HOOK_VARIABLE] = HOOK
    if (merged := _merged(environ.get(COPY_VARIABLE, ""), names)) is not None:
        changes[COPY_VARIABLE] = merged
    return changes
