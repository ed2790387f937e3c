"""The doctor's JSON report and exit status on every kind of emulated pod and GPU."""

from __future__ import annotations

from pathlib import Path

from doctorkit import H100, RTX_5070, SITE, consumer, extension


def test_schema_and_common_fields(pods, doctor) -> None:
    run = doctor(pods("bare"), "--json")
    report = run.report
    assert report["schema"] == "tmaguard.doctor/2"
    assert set(report) >= {
        "tmaguard", "time", "active", "status", "exit_code", "elapsed_ms", "python", "toggles", "gpu",
        "layers", "libcuda", "vllm", "consumers", "architectures", "guard", "decision", "record",
        "active_check", "findings", "fix",
    }  # fmt: skip
    assert report["active"] is False and report["active_check"] is None
    assert report["gpu"]["source"] == "procfs"  # passive: never NVML, which is the layer in vCUDA pods
    assert report["vllm"] == {
        "found": True,
        "version": "0.32.0",
        "package_dir": str(Path(SITE) / "vllm"),
        "platform_plugins": True,
        "imported_at_platform_load": ["vllm._C_stable_libtorch"],
    }
    assert report["guard"]["platform_plugin"] and report["guard"]["import_hook"] and report["guard"]["hooked"]
    assert {row["kind"] for row in report["consumers"]} == {
        "vllm-extension", "torch-library", "cuda-runtime", "triton", "cuda-python",
    }  # fmt: skip
    for finding in report["findings"]:
        assert set(finding) == {"id", "severity", "title", "detail", "subject", "fix"}
        assert finding["severity"] in ("error", "warning", "info", "ok")
    severities = [f["severity"] for f in report["findings"]]
    assert severities == sorted(severities, key=("error", "warning", "info", "ok").index)


def test_bare_metal_rtx4090_is_healthy(pods, doctor) -> None:
    run = doctor(pods("bare"), "--json")
    report = run.report
    assert run.returncode == 0 and report["status"] == "healthy" and report["exit_code"] == 0
    (gpu,) = report["gpu"]["gpus"]
    assert gpu == {
        "index": 0,
        "name": "NVIDIA GeForce RTX 4090",
        "compute_capability": "8.9",
        "capability": [8, 9],
        "sm": "sm_89",
        "bus_id": "0000:01:00.0",
    }
    assert report["gpu"]["driver_version"] == "580.95.05" and report["gpu"]["cuda_driver_version"] == 13000
    assert report["layers"] == []
    assert report["libcuda"]["soname"] == "libcuda.so.1" and report["libcuda"]["how"] == "LD_LIBRARY_PATH"
    assert all(row["lacks"] == [] for row in report["consumers"])
    assert (
        report["guard"]["supplies"] == [] and "has every entry point needed" in report["decision"]["summary"]
    )
    assert consumer(report, "triton")["needs"] == [
        "cuOccupancyMaxActiveClusters", "cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col",
        "cuLaunchKernelEx",
    ]  # fmt: skip
    assert consumer(report, "libcudart.so.13")["needs"] == ["cuGetProcAddress_v2"]
    assert consumer(report, "torch.lib.libcaffe2_nvrtc")["scope"] == "global"
    core = extension(report, "vllm._C_stable_libtorch")["coverage"]["sm_89"]
    assert core["verdict"] == "partial" and core["native"] > 0
    assert extension(report, "vllm.vllm_flash_attn._vllm_fa2_C")["coverage"]["sm_89"]["verdict"] == "native"
    fa3 = extension(report, "vllm.vllm_flash_attn._vllm_fa3_C")
    assert fa3["sass"] == ["sm_90a"] and fa3["coverage"]["sm_89"]["verdict"] == "none"
    assert "vllm.vllm_flash_attn._vllm_fa3_C (sm_90a)" in run.finding("arch-coverage")["detail"]
    assert run.ids("error", "warning") == set() and report["fix"]["steps"] == []


def test_vcuda_gaps_are_covered_by_the_guard(pods, doctor) -> None:
    pod = pods("vcuda")
    run = doctor(pod, "--json")
    report = run.report
    assert run.returncode == 0, report["findings"]
    assert report["layers"][0]["name"] == "vcuda"
    assert "libcuda.so.1 has SONAME libcuda-control.so" in report["layers"][0]["evidence"]
    libcuda = report["libcuda"]
    assert libcuda["path"] == str(pod.lib_dir / "libcuda.so.1") and libcuda["soname"] == "libcuda-control.so"
    assert libcuda["real_driver"] == str(pod.real_driver)
    core = consumer(report, "vllm._C_stable_libtorch")
    assert core["lacks"] == ["cuGetProcAddress_v2", "cuTensorMapEncodeTiled"]
    assert core["coverage"] == {"cuGetProcAddress_v2": "overlay", "cuTensorMapEncodeTiled": "overlay"}
    triton = consumer(report, "triton")
    assert triton["scope"] == "handle"
    assert triton["coverage"]["cuLaunchKernelEx"] == "overlay"
    assert triton["coverage"]["cuOccupancyMaxActiveClusters"] == "overlay"  # from the real driver
    assert consumer(report, "libcudart.so.13")["coverage"] == {"cuGetProcAddress_v2": "overlay"}
    supplied = {f["subject"] for f in report["findings"] if f["id"] == "gap-supplied"}
    assert supplied >= {"cuTensorMapEncodeTiled", "cuGetProcAddress_v2", "cuLaunchKernelEx"}
    assert "gap-handle-unfixed" not in run.ids("error", "warning", "info")  # the overlay carries them all
    assert [s["library"] for s in report["guard"]["supplies"]] == ["overlay"]
    assert report["guard"]["supplies"][0]["file_exists"]


def test_vcuda_without_the_overlay_names_what_stays_broken(pods, doctor) -> None:
    run = doctor(pods("vcuda"), "--json", env={"TMAGUARD_OVERLAY": "off"})
    report = run.report
    assert run.returncode == 1 and report["status"] == "problems"
    core = consumer(report, "vllm._C_stable_libtorch")
    assert core["coverage"] == {"cuGetProcAddress_v2": "shim", "cuTensorMapEncodeTiled": "shim"}
    triton = run.finding("gap-handle-unfixed", "triton")
    assert triton["severity"] == "error" and "Every Triton kernel launch fails" in triton["detail"]
    assert "TMAGUARD_OVERLAY=off" in triton["detail"]
    assert triton["fix"]["env"] == {"TMAGUARD_OVERLAY": "auto"}
    assert run.finding("gap-handle-unfixed", "libcudart.so.13")["severity"] == "warning"
    assert report["fix"]["env"] == {"TMAGUARD_OVERLAY": "auto"}
    assert 'data:\n  TMAGUARD_OVERLAY: "auto"' in report["fix"]["manifest"]  # the toggles' ConfigMap


def test_vcuda_with_the_guard_off_is_a_problem_with_the_fix(pods, doctor) -> None:
    run = doctor(pods("vcuda"), "--json", env={"TMAGUARD_MODE": "validate"})
    report = run.report
    assert run.returncode == 1
    assert consumer(report, "vllm._C_stable_libtorch")["coverage"]["cuTensorMapEncodeTiled"] == "off"
    finding = run.finding("gap-guard-off", "cuTensorMapEncodeTiled")
    assert finding["severity"] == "error" and "TMAGUARD_MODE=validate" in finding["title"]
    assert "vLLM fails to import it" in finding["detail"]
    assert report["fix"]["env"] == {"TMAGUARD_MODE": "auto"}
    assert '# ConfigMap tmaguard-toggles:\ndata:\n  TMAGUARD_MODE: "auto"' in report["fix"]["manifest"]


def test_vcuda_fork_is_healthy(pods, doctor) -> None:
    """Healthy with the guard: its overlay answers the fork's look-ups, which hand out legacy ABIs."""
    run = doctor(pods("vcuda-fork"), "--json")
    report = run.report
    assert run.returncode == 0
    assert report["layers"][0]["name"] == "vcuda-fork"
    assert consumer(report, "vllm._C_stable_libtorch")["lacks"] == []
    assert consumer(report, "triton")["lacks"] == ["cuOccupancyMaxActiveClusters"]
    assert [supply["library"] for supply in report["guard"]["supplies"]] == ["overlay"]
    assert run.finding("lookups-replaced")["severity"] == "ok"


def test_hami_is_healthy_with_its_tensor_parallel_caveat(pods, doctor) -> None:
    run = doctor(pods("hami"), "--json")
    report = run.report
    assert run.returncode == 0
    assert report["layers"][0]["name"] == "hami"
    assert "preloads" in report["layers"][0]["evidence"][0]
    assert report["libcuda"]["soname"] == "libcuda.so.1"  # NVIDIA's own driver stays
    caveat = run.finding("known-hami-tensor-parallel")
    assert caveat["severity"] == "info" and caveat["fix"]["vllm_args"] == ["--disable-custom-all-reduce"]
    assert report["fix"]["vllm_args"] == []  # a caveat, not a problem: not in the merged fix


def test_lupine_rtx4090(pods, doctor) -> None:
    run = doctor(pods("lupine"), "--json")
    report = run.report
    assert run.returncode == 0
    (layer,) = report["layers"]
    assert layer == {
        "name": "lupine", "label": "lupine (GPU over the network)", "evidence": ["env LUPINE_SERVER"],
        "remote": True, "conditions": [],
    }  # fmt: skip
    assert report["libcuda"]["real_driver"] is None
    assert run.finding("known-lupine-no-local-driver")["severity"] == "info"


def test_lupine_h100_cannot_have_tma(pods, doctor) -> None:
    run = doctor(pods("lupine", **H100), "--json")
    report = run.report
    assert report["decision"]["tma"]["usable"] is False
    tma = run.finding("tma")
    assert tma["severity"] == "info" and "lupine" in tma["detail"]
    assert run.returncode == (1 if run.ids("error", "warning") else 0)


def test_no_gpu(pods, doctor) -> None:
    run = doctor(pods("nogpu"), "--json")
    report = run.report
    assert run.returncode == 1 and report["gpu"]["gpus"] == []
    assert "/proc/driver/nvidia/version is missing" in report["gpu"]["error"]
    no_gpu = run.finding("no-driver-module")
    assert no_gpu["severity"] == "error" and "nvidia.com/gpu: 1" in "\n".join(no_gpu["fix"]["manifest"])
    assert run.finding("libcuda-missing")["severity"] == "error"
    assert report["libcuda"]["path"] is None and report["architectures"]["devices"] == []
    assert "nvidia.com/gpu: 1" in report["fix"]["manifest"]


def test_h100_bare_metal(pods, doctor) -> None:
    run = doctor(pods("bare", **H100), "--json")
    report = run.report
    assert run.returncode == 0
    assert report["gpu"]["gpus"][0]["sm"] == "sm_90"
    assert run.finding("tma")["severity"] == "ok"
    assert extension(report, "vllm.vllm_flash_attn._vllm_fa3_C")["coverage"]["sm_90"]["verdict"] == "native"
    assert extension(report, "vllm.vllm_flash_attn._vllm_fa2_C")["coverage"]["sm_90"]["verdict"] == "jit"
    assert "PTX only" in run.finding("arch-coverage")["detail"]


def test_rtx5070_has_no_sm90a_code_but_is_healthy(pods, doctor) -> None:
    run = doctor(pods("bare", **RTX_5070), "--json")
    report = run.report
    assert run.returncode == 0
    assert report["architectures"]["devices"] == ["sm_120"]
    core = extension(report, "vllm._C_stable_libtorch")["coverage"]["sm_120"]
    assert core["native"] > 0 and "sm_90a" in core["missing"]
    assert extension(report, "vllm.vllm_flash_attn._vllm_fa3_C")["coverage"]["sm_120"]["verdict"] == "none"
    detail = run.finding("arch-coverage", "sm_120")["detail"]
    assert "no sm_120 code in" in detail and "vllm.vllm_flash_attn._vllm_fa3_C (sm_90a)" in detail


def test_a_driver_too_old_for_the_cuda_13_runtime_is_an_error(pods, doctor, run_python) -> None:
    """A bare R535 node under this environment's CUDA 13 torch and vLLM: the driver exports every entry point
    vLLM's extensions bind, so the import works, and vLLM then fails at CUDA initialisation. The guard's
    line says so at ERROR, first, and the record is degraded; the doctor's finding has the remedy (the
    driver needed; vLLM's CUDA 12.9 build, which runs on R535; forward compatibility on this H100)."""
    pod = pods("bare", driver="535.54.03", **H100)
    run = run_python(pod, "from vllm_tmaguard.guard import activate\nactivate('import-hook')\n")
    (line,) = run.guard_lines()
    assert " ERROR " in line and "supplied" not in line and "has every entry point" not in line
    assert "driver too old for vLLM's CUDA runtime" in line
    assert "PROBLEM: NVIDIA driver 535.54.03 (up to CUDA 12.2); torch (CUDA 13.0) and vLLM" in line
    assert "fix: upgrade the node's NVIDIA driver to 580.65.06 or newer" in line
    record = run.last_record()
    assert record["outcome"] == "degraded" and record["problems"][0]["code"] == "driver-too-old"

    report = doctor(pod, "--json")
    assert report.returncode == 1 and report.report["gpu"]["cuda_driver_version"] == 12020
    found = report.finding("driver-too-old")
    assert found["severity"] == "error" and found["subject"] == "/proc/driver/nvidia/version"
    assert "CUDA initialisation" in found["detail"]
    fix = found["fix"]["text"]
    assert fix.startswith("Upgrade the node's NVIDIA driver to 580.65.06 or newer")
    assert "vLLM 0.32.0's CUDA 12.9 build" in fix and "cuda-compat-13-0" in fix
    assert "tma" not in report.ids("ok", "info")  # no CUDA call works: TMA is moot
    assert report.finding("record")["severity"] == "warning"  # the guard's own record: degraded
