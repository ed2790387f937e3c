"""Ray's two hooks, for vLLM's Ray workers (docs/operator.md, "Ray"):

- `runtime_env_hook`: Ray calls it in `ray.init` of the process that starts a job (vLLM's engine, where the
  guard set `RAY_RUNTIME_ENV_HOOK` to it: ray_env.py) with the job's runtime env; it adds the guard's toggles
  set in that process's environment to the env vars every worker process of the job starts with, where the
  job does not set them itself. Fails open: on any error the runtime env comes back as it was.
- `setup`: for `worker_process_setup_hook` in a job's runtime env (a RayService's or RayJob's), where the
  package reaches the workers without its .pth being read (runtime_env py_modules or working_dir, a
  PYTHONPATH): arms the guard's import hook in every worker process before anything imports vLLM, as the
  pip install's .pth does at interpreter start."""

from __future__ import annotations

import os
from typing import Any


def runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any] | None:
    try:
        from .stages.ray_env import carried

        toggles = carried(os.environ)
        if not toggles:
            return runtime_env
        updated = dict(runtime_env or {})
        env_vars = dict(updated.get("env_vars") or {})
        for name, value in toggles.items():
            env_vars.setdefault(name, value)
        updated["env_vars"] = env_vars
        return updated
    except Exception:  # the job starts as it would without the guard
        return runtime_env


def setup() -> None:
    from . import _import_hook

    _import_hook.arm()
