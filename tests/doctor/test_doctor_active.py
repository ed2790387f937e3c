"""The doctor stays passive by default; --active initialises CUDA in child processes."""

from __future__ import annotations

import json
from pathlib import Path

from doctorkit import H100

PASSIVE_CHECK = """
import json, sys
CUDA_LIBRARIES = ("libcuda", "libnvidia-ml", "libtmaguard", "libcudart")
from vllm_tmaguard.doctor import main
code = main(["--json"])
maps = open("/proc/self/maps").read()
loaded = sorted({l.split()[-1].rsplit("/", 1)[-1] for l in maps.splitlines() if "/lib" in l and ".so" in l})
print("PASSIVE " + json.dumps({
    "code": code,
    "modules": [m for m in ("torch", "vllm", "triton", "cuda", "pynvml") if m in sys.modules],
    "cuda_libraries": [n for n in loaded if n.startswith(CUDA_LIBRARIES)],
}))
"""


def test_the_doctor_itself_stays_passive(pods, run_python) -> None:
    run = run_python(pods("vcuda"), PASSIVE_CHECK)
    line = next(line for line in run.stdout.splitlines() if line.startswith("PASSIVE "))
    assert json.loads(line.removeprefix("PASSIVE ")) == {"code": 0, "modules": [], "cuda_libraries": []}


def test_active_on_bare_metal(pods, doctor) -> None:
    pod = pods("bare")
    run = doctor(pod, "--json", "--active")
    report = run.report
    assert run.returncode == 0 and report["active"] is True
    guarded = report["active_check"]["guarded"]["result"]
    assert guarded["guard"]["actions"] == [] and guarded["binding"]["encode"] == {
        "call": "cuTensorMapEncodeTiled",
        "result": 0,
        "name": "CUDA_SUCCESS",
    }
    assert guarded["binding"]["bound_from"] == str(pod.lib_dir / "libcuda.so.1")
    assert [s["call"] for s in guarded["binding"]["steps"]] == [
        "cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuMemAlloc_v2",
        "cuTensorMapEncodeTiled",
    ]  # fmt: skip
    plain = report["active_check"]["plain"]["result"]["cuda_python"]
    assert plain["available"] and plain["encode"]["result"] == 0
    assert {f["subject"] for f in report["findings"] if f["id"] == "active-encode-ok"} == {
        "guarded", "guarded-cuda-python", "plain-cuda-python",
    }  # fmt: skip


def test_active_on_vcuda(pods, doctor) -> None:
    run = doctor(pods("vcuda"), "--json", "--active")
    report = run.report
    assert run.returncode == 0
    guarded = report["active_check"]["guarded"]["result"]
    assert guarded["guard"]["actions"][0]["kind"] == "load-overlay"
    binding = guarded["binding"]
    assert binding["encode"]["result"] == 0 and binding["bound_from"].endswith("/libcuda.so.1")
    assert "overlay-" in binding["bound_from"]  # the guard's overlay answered, not the layer
    assert binding["shim_source_means"] == "the real driver file the layer opened"  # the layer lacks it
    assert guarded["cuda_python"]["encode"]["result"] == 0  # inside a vLLM process, through the overlay
    plain = report["active_check"]["plain"]["result"]["cuda_python"]
    assert plain["steps"] == [{"call": "cuInit", "error": "RuntimeError: Failed to get cuGetProcAddress_v2"}]
    outside = run.finding("active-cuda-python-failed", "plain-cuda-python")
    assert outside["severity"] == "info" and "the guard fixes this" in outside["detail"]
    assert not Path(binding["bound_from"]).exists()  # the doctor removes the overlay it had the guard write


def test_active_on_lupine_h100_reports_the_failing_encoder(pods, doctor) -> None:
    run = doctor(pods("lupine", **H100), "--json", "--active")
    assert run.returncode == 1
    failed = run.finding("active-encode-failed", "guarded")
    # no local driver behind the network layer: the overlay's encoder never has a real one to forward to
    assert failed["severity"] == "error" and "returned 3 (CUDA_ERROR_NOT_INITIALIZED)" in failed["title"]
