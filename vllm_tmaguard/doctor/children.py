"""The doctor's child processes: NVML (started first, so the file probes overlap it) and the --active checks,
each killed with its process group at its time limit. What runs inside them is child.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from ..gpu import Gpu, GpuFacts
from .constants import RESULT_TAG

DEFAULT_NVML_TIMEOUT = 5.0
DEFAULT_ACTIVE_TIMEOUT = 60.0

# `python -I -S -c CHILD_BOOT MODE JSON`: isolated, no site hooks; doctor/child.py is imported (its cached
# bytecode used) from the parent's sys.path, which the JSON carries.
CHILD_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[2])['path']; "
    "from vllm_tmaguard.doctor.child import main; main()"
)


@dataclasses.dataclass
class ChildRun:
    """One child process: started at once, collected later, so the parent's file probes overlap it."""

    process: subprocess.Popen[str]
    started: float
    timeout: float

    @classmethod
    def start(cls, mode: str, arguments: dict[str, Any], timeout: float) -> ChildRun:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", CHILD_BOOT, mode, json.dumps({"path": sys.path, **arguments})],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: a helper it forks is killed with it
        )
        return cls(process, time.perf_counter(), timeout)

    def collect(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """(the JSON the child printed, or None; how it ran)."""
        remaining = max(0.0, self.timeout - (time.perf_counter() - self.started))
        timed_out = False
        try:
            out, err = self.process.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                self.process.kill()
            try:
                out, err = self.process.communicate(timeout=2)
            except subprocess.TimeoutExpired:  # a helper left the process group and holds the pipes open
                self.process.wait()
                out, err = "", "its output pipes were held open by a process that left its process group"
        lines = [line for line in out.splitlines() if line.startswith(RESULT_TAG)]
        result = None
        if lines:
            try:
                result = json.loads(lines[-1][len(RESULT_TAG) :])
            except ValueError:
                result = None
        run = {
            "timeout_s": self.timeout,
            "timed_out": timed_out and result is None,
            "exit_status": None if timed_out else self.process.returncode,
            "elapsed_ms": round((time.perf_counter() - self.started) * 1e3, 1),
            "stderr_tail": err.strip()[-400:] or None,
        }
        return result, run


def start_gpu_query(timeout: float) -> ChildRun:
    return ChildRun.start("nvml", {}, timeout)


def gpu_facts_from(result: dict[str, Any] | None, run: dict[str, Any]) -> GpuFacts:
    """GpuFacts from the child's answer, or one whose error says why there is none."""
    if result is None:
        if run["timed_out"]:
            why = f"NVML did not answer within {run['timeout_s']:g} s (the query was killed)"
        else:
            why = f"the NVML query process exited with status {run['exit_status']} before answering"
            if run["stderr_tail"]:
                why += f": {run['stderr_tail'].splitlines()[-1]}"
        return GpuFacts(error=why, source="nvml (child process)")
    gpus = tuple(
        Gpu(**{**gpu, "compute_capability": tuple(gpu["compute_capability"])}) for gpu in result["gpus"]
    )
    return GpuFacts(
        gpus=gpus,
        driver_version=result.get("driver_version"),
        cuda_driver_version=result.get("cuda_driver_version"),
        error=result.get("error"),
        source="nvml (child process)",
    )


# --active: CUDA initialised in child processes through the pod's own libcuda.so.1

SHIM_SOURCES = {
    -1: "none: no real encoder reachable, the guard answers CUDA_ERROR_NOT_SUPPORTED",
    0: "not resolved",
    1: "the layer's cuGetProcAddress_v2",
    2: "the layer's cuGetProcAddress",
    3: "the real driver file the layer opened",
    4: "the layer's own symbol",
}


def run_active(timeout: float) -> dict[str, Any]:
    """The plain and the guarded check (child.py), one child process each, one after the other."""
    import shutil  # only --active needs these: the passive doctor's start-up stays short
    import tempfile

    plain, plain_run = ChildRun.start("plain", {}, timeout).collect()
    record_dir = tempfile.mkdtemp(prefix="tmaguard-doctor-")
    try:
        guarded, guarded_run = ChildRun.start("guarded", {"record_dir": record_dir}, timeout).collect()
    finally:
        shutil.rmtree(record_dir, ignore_errors=True)
    binding = (guarded or {}).get("binding")
    if binding and binding.get("shim_source") is not None:
        binding["shim_source_means"] = SHIM_SOURCES.get(binding["shim_source"], "unknown")
    return {"plain": {"result": plain, "run": plain_run}, "guarded": {"result": guarded, "run": guarded_run}}
