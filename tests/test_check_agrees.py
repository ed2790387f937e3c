"""`tmaguard check` and the guard decide with one script (pipeline.decide): on every emulated pod the tests
build, the check's verdict (outcome, problems, the level its exit status follows) is the guard's in a vLLM
server's front started there, a machine without a GPU or libcuda.so.1 included (issue 34)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from podkit import FIELD_KINDS, KINDS

# The guard alone in a process whose command line is a vLLM server's (what the check decides for).
GUARD_AS_SERVER = """
import json, sys
sys.argv = ["/usr/local/bin/vllm", "serve", "MODEL"]
from vllm_tmaguard.guard import activate
from vllm_tmaguard.issue import level_of
record = activate("test")
print("RESULT " + json.dumps(None if record is None else {**record, "level": level_of(record)}))
"""


def _value(action: dict) -> str | None:
    return None if action["kind"] == "load-overlay" else action["value"]


def _verdict(record: dict) -> tuple:
    return (
        record["outcome"],
        [(p["code"], p["subject"]) for p in record["problems"]],
        # the overlay's file is not compared: the guard's copy in its private directory, the check's own
        [(a["kind"], a["target"], _value(a)) for a in record["actions"]],
        record["summary"].replace("would be supplied", "supplied").replace("would answer", "answers"),
    )


@pytest.mark.parametrize("kind", KINDS + tuple(k for k in FIELD_KINDS if k != "kubeshare"))
def test_the_check_decides_as_the_guard(kind: str, pods, run_python, tmp_path) -> None:
    pod = pods(kind, cc="9.0", gpu_name="NVIDIA H100 80GB HBM3") if kind != "nogpu" else pods(kind)
    env = {"CUDA_DEVICE_MEMORY_LIMIT_0": "8g"} if kind == "hami" else {}  # a limit vLLM's default exceeds
    run = run_python(pod, GUARD_AS_SERVER, env)
    line = next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))
    guard = json.loads(line.removeprefix("RESULT "))
    check = subprocess.run(
        [sys.executable, "-m", "vllm_tmaguard", "check", "--json"],
        env=pod.environ({**env, "TMAGUARD_RECORD_DIR": str(tmp_path / "check-records")}),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    checked = json.loads(check.stdout)
    assert _verdict(checked) == _verdict(guard), kind
    assert check.returncode == (1 if guard["level"] in ("warning", "error") else 0), (kind, guard["level"])
    if kind == "nogpu":  # no GPU, no libcuda.so.1: nothing to do, quietly, in both
        assert guard["outcome"] == "no-gpu" and guard["level"] == "debug" and check.returncode == 0
