"""The doctor's child processes for --active (NVML, then CUDA through the pod's libcuda.so.1), each killed
with its process group at its time limit. What runs inside them is child.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from ..stages import door
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


# --active: CUDA initialised in child processes through the pod's own libcuda.so.1

SHIM_SOURCES = {
    -1: "none: no real encoder reachable, the guard answers CUDA_ERROR_NOT_SUPPORTED",
    0: "not resolved",
    1: "the layer's cuGetProcAddress_v2",
    2: "the layer's cuGetProcAddress",
    3: "the real driver file the layer opened",
    4: "the layer's own symbol",
}


def run_active(timeout: float, nvml_timeout: float = DEFAULT_NVML_TIMEOUT) -> dict[str, Any]:
    """NVML (the pod's libnvidia-ml.so.1: in a vCUDA pod the layer itself), then the plain and the guarded
    CUDA check (child.py), one child process each, one after the other."""
    nvml, nvml_run = ChildRun.start("nvml", {}, nvml_timeout).collect()
    plain, plain_run = ChildRun.start("plain", {}, timeout).collect()
    with door.scratch_directory("tmaguard-doctor-") as record_dir:
        guarded, guarded_run = ChildRun.start("guarded", {"record_dir": record_dir}, timeout).collect()
    binding = (guarded or {}).get("binding")
    if binding and binding.get("shim_source") is not None:
        binding["shim_source_means"] = SHIM_SOURCES.get(binding["shim_source"], "unknown")
    return {
        "nvml": {"result": nvml, "run": nvml_run},
        "plain": {"result": plain, "run": plain_run},
        "guarded": {"result": guarded, "run": guarded_run},
    }
