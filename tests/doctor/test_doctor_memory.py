"""The doctor on memory (issue 32, item 1): the layer's limit against vLLM's share, and with --active the
limit against what CUDA shows a fresh process, where a limit that CUDA does not show is not in force."""

from __future__ import annotations

from doctorkit import H100


def test_a_limit_vllms_default_cannot_start_under(pods, doctor) -> None:
    run = doctor(pods("hami", **H100), "--json", "--active", env={"CUDA_DEVICE_MEMORY_LIMIT_0": "8g"})
    report = run.report
    set_to = run.finding("memory-fraction-set")
    assert set_to["severity"] == "info" and "--gpu-memory-utilization 0.84" in set_to["title"]
    assert report["decision"]["memory"]["limit_bytes"] == 8 << 30
    guarded = report["active_check"]["guarded"]["result"]["binding"]["memory"]
    assert guarded["total"] == 8 << 30  # cuMemGetInfo in the guarded child: the layer's limit
    assert run.finding("memory-limit-shown")["severity"] == "ok"


def test_a_limit_cuda_does_not_show_is_not_in_force(pods, doctor) -> None:
    """HAMi's variables and its preload entry, but the preloaded library is gone: the loader skips it, CUDA
    shows the whole device, and --active says the limit is not in force (exit status 1)."""
    pod = pods("hami", **H100)
    env = {"CUDA_DEVICE_MEMORY_LIMIT_0": "8g", "LD_PRELOAD": str(pod.root / "usr/local/vgpu/gone/libvgpu.so")}
    run = doctor(pod, "--json", "--active", env=env)
    not_shown = run.finding("memory-limit-not-shown")
    assert run.returncode == 1 and not_shown["severity"] == "error"
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=8g" in not_shown["title"]
