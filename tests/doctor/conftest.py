"""The doctor fixture: `python -m vllm_tmaguard doctor ARGS` in a fresh process inside a pod."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from doctorkit import PRINTING, DoctorRun
from podkit import child_environ


@pytest.fixture
def doctor(tmp_path: Path) -> Callable[..., DoctorRun]:
    """Runs `python -m vllm_tmaguard doctor ARGS` in a fresh process inside `pod`."""

    def run(
        pod,
        *args: str,
        env: Mapping[str, str] | None = None,
        python: tuple[str, ...] = (sys.executable,),
        timeout: float = 120,
    ) -> DoctorRun:
        record_dir = tmp_path / "records"
        child_env = child_environ(pod, record_dir, env, PRINTING)
        done = subprocess.run(
            [*python, "-m", "vllm_tmaguard", "doctor", *args],
            env=child_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=tmp_path,
        )
        assert "Traceback" not in done.stderr, done.stderr
        return DoctorRun(done.returncode, done.stdout, done.stderr, record_dir)

    return run
