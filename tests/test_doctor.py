"""`tmaguard doctor` in fresh processes on emulated pods: the JSON report and exit status of every scenario,
the readable output against a golden file, damaged files, a hanging NVML, a missing vLLM, --active, and that
the doctor itself never imports torch or vLLM nor loads a CUDA library."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from podkit import child_environ, scrubbed_environ

from vllm_tmaguard.doctor.children import gpu_facts_from
from vllm_tmaguard.doctor.findings.platform import gpu_findings
from vllm_tmaguard.doctor.render import render_text
from vllm_tmaguard.vllm_probe import find_package_dir

GOLDEN = Path(__file__).resolve().parent / "golden" / "doctor_vcuda_rtx4090.txt"
H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "cc": "9.0"}
RTX_5070 = {"gpu_name": "NVIDIA GeForce RTX 5070", "cc": "12.0"}
# Besides the pod-leaking variables, those that change how the doctor prints.
_PRINTING = ("COLUMNS", "NO_COLOR", "FORCE_COLOR")
SITE = str(Path(find_package_dir("vllm")).parent)


@dataclass(frozen=True)
class DoctorRun:
    returncode: int
    stdout: str
    stderr: str
    record_dir: Path

    @property
    def report(self) -> dict:
        assert self.stdout.startswith("{"), f"no JSON\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return json.loads(self.stdout)

    def finding(self, finding_id: str, subject: str | None = None) -> dict:
        found = [
            f for f in self.report["findings"] if f["id"] == finding_id and subject in (None, f["subject"])
        ]
        assert found, f"no {finding_id} finding in {[f['id'] for f in self.report['findings']]}"
        return found[0]

    def ids(self, *severities: str) -> set[str]:
        return {f["id"] for f in self.report["findings"] if f["severity"] in severities}


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
        child_env = child_environ(pod, record_dir, env, _PRINTING)
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


def consumer(report: dict, name: str) -> dict:
    return next(row for row in report["consumers"] if row["name"] == name)


def extension(report: dict, module: str) -> dict:
    return next(e for e in report["architectures"]["extensions"] if e["module"] == module)


def test_schema_and_common_fields(pods, doctor) -> None:
    run = doctor(pods("bare"), "--json")
    report = run.report
    assert report["schema"] == "tmaguard.doctor/1"
    assert set(report) >= {
        "tmaguard", "time", "active", "status", "exit_code", "elapsed_ms", "python", "toggles", "gpu",
        "layers", "libcuda", "vllm", "consumers", "architectures", "guard", "decision", "record",
        "active_check", "findings", "fix",
    }  # fmt: skip
    assert report["active"] is False and report["active_check"] is None
    assert (
        report["gpu"]["query"]["how"] == "NVML in a child process" and not report["gpu"]["query"]["timed_out"]
    )
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
        "sm": "sm_89",
        "mig": False,
        "virtualization": "none",
    }
    assert report["gpu"]["driver_version"] == "550.142" and report["gpu"]["cuda_driver_version"] == 12040
    assert report["layers"] == []
    assert report["libcuda"]["soname"] == "libcuda.so.1" and report["libcuda"]["how"] == "LD_LIBRARY_PATH"
    assert all(row["lacks"] == [] for row in report["consumers"])
    assert report["guard"]["supplies"] == [] and "nothing to load" in report["decision"]["summary"]
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
    assert triton["coverage"]["cuOccupancyMaxActiveClusters"] == "none"  # not one of the overlay's names
    assert consumer(report, "libcudart.so.13")["coverage"] == {"cuGetProcAddress_v2": "overlay"}
    supplied = {f["subject"] for f in report["findings"] if f["id"] == "gap-supplied"}
    assert supplied >= {"cuTensorMapEncodeTiled", "cuGetProcAddress_v2", "cuLaunchKernelEx"}
    assert run.finding("gap-handle-unfixed", "triton")["severity"] == "info"
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
    assert "- name: TMAGUARD_OVERLAY" in report["fix"]["manifest"]


def test_vcuda_with_the_guard_off_is_a_problem_with_the_fix(pods, doctor) -> None:
    run = doctor(pods("vcuda"), "--json", env={"TMAGUARD_MODE": "validate"})
    report = run.report
    assert run.returncode == 1
    assert consumer(report, "vllm._C_stable_libtorch")["coverage"]["cuTensorMapEncodeTiled"] == "off"
    finding = run.finding("gap-guard-off", "cuTensorMapEncodeTiled")
    assert finding["severity"] == "error" and "TMAGUARD_MODE=validate" in finding["title"]
    assert "vLLM fails to import it" in finding["detail"]
    assert report["fix"]["env"] == {"TMAGUARD_MODE": "auto"}
    assert '- name: TMAGUARD_MODE\n    value: "auto"' in report["fix"]["manifest"]


def test_vcuda_fork_is_healthy(pods, doctor) -> None:
    run = doctor(pods("vcuda-fork"), "--json")
    report = run.report
    assert run.returncode == 0
    assert report["layers"][0]["name"] == "vcuda-fork"
    assert consumer(report, "vllm._C_stable_libtorch")["lacks"] == []
    assert consumer(report, "triton")["lacks"] == ["cuOccupancyMaxActiveClusters"]
    assert report["guard"]["supplies"] == []


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
    assert layer == {"name": "lupine", "evidence": ["env LUPINE_SERVER"], "forwards_to_local_driver": False}
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
    assert run.returncode == 1 and report["gpu"]["gpus"] == [] and report["gpu"]["error"] is None
    no_gpu = run.finding("no-gpu")
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


def _normalise(report: dict, replacements: dict[str, str]) -> dict:
    """Paths that differ from machine to machine replaced (longest first), timings fixed."""
    text = json.dumps(report)
    for path, name in sorted(replacements.items(), key=lambda item: -len(item[0])):
        text = text.replace(path, name)
    normalised = json.loads(text)
    normalised["elapsed_ms"] = 0.0
    return normalised


def test_readable_output_golden(pods, doctor, monkeypatch) -> None:
    """The readable report of the first scenario (vCUDA, RTX 4090). Rendered with render_text() from the JSON
    the command printed, after replacing machine-specific paths, so the wrapping is the same everywhere.
    Refresh after an intended change: TMAGUARD_UPDATE_GOLDEN=1 pytest tests/test_doctor.py -k golden"""
    pod = pods("vcuda")
    run = doctor(pod, "--json")
    report = _normalise(
        run.report, {str(pod.root): "/pod", SITE: "/site-packages", str(run.record_dir): "/records"}
    )
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    render_text(report, file=out)
    text = "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"
    if os.environ.get("TMAGUARD_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_readable_output_of_the_command(pods, doctor) -> None:
    run = doctor(pods("vcuda"), env={"TMAGUARD_OVERLAY": "off"})
    assert run.returncode == 1 and run.stderr == ""
    lines = run.stdout.splitlines()
    assert lines[0].startswith("tmaguard doctor 0.1.0 (passive")
    for heading in ("Driver entry points by consumer", "GPU code in vLLM's extensions", "Findings", "Fix"):
        assert heading in lines
    assert any(line.startswith("ERROR") and "triton: libcuda.so.1 lacks" in line for line in lines)
    assert re.fullmatch(r"3 problems found \(exit 1\), [0-9.]+ ms", lines[-1].rstrip()), lines[-1]
    assert 'value: "auto"' in run.stdout


def test_hanging_nvml_is_killed_and_reported(pods, doctor) -> None:
    mark = uuid.uuid4().hex
    run = doctor(
        pods("vcuda"),
        "--json",
        "--nvml-timeout",
        "0.5",
        env={"STANDIN_NVML_HANG": "1", "DOCTOR_TEST_MARK": mark},
    )
    report = run.report
    assert run.returncode == 1
    assert report["gpu"]["query"]["timed_out"] and report["gpu"]["query"]["timeout_s"] == 0.5
    finding = run.finding("nvml-timeout")
    assert finding["severity"] == "error" and "0.5 s" in finding["title"]
    assert report["elapsed_ms"] < 4000
    assert report["libcuda"]["soname"] == "libcuda-control.so"  # the rest of the report is still there
    assert not _processes_with(mark), "the hanging NVML child outlived the doctor"


def _processes_with(mark: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as file:
                    if f"DOCTOR_TEST_MARK={mark}".encode() in file.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_failing_nvml_is_a_finding(pods, doctor) -> None:
    run = doctor(pods("vcuda"), "--json", env={"STANDIN_NVML_FAIL": "9"})
    finding = run.finding("nvml-error")
    assert run.returncode == 1 and "Driver Not Loaded" in finding["detail"]


def test_crashed_nvml_query_is_explained() -> None:
    run = {"timeout_s": 5.0, "timed_out": False, "exit_status": 255, "elapsed_ms": 3.0, "stderr_tail": "bye"}
    facts = gpu_facts_from(None, run)
    assert (
        facts.gpus == ()
        and facts.error == "the NVML query process exited with status 255 before answering: bye"
    )
    report = {"gpu": {"gpus": [], "error": facts.error, "query": run}}
    (finding,) = gpu_findings(report)
    assert finding["id"] == "nvml-crashed" and finding["severity"] == "error"


def test_corrupted_libcuda_is_a_finding(pods, doctor) -> None:
    pod = pods("vcuda")
    target = pod.lib_dir / "libcuda.so.1"
    target.unlink()  # a hard link of libcuda-control.so: replace it, do not write through it
    target.write_bytes(b"\x7fELF garbage" + bytes(200))
    run = doctor(pod, "--json")
    finding = run.finding("libcuda-missing")
    assert run.returncode == 1 and finding["severity"] == "error"
    assert f"{target}: unknown ELF class/byte order" in finding["detail"]


def _fake_vllm(base: Path) -> Path:
    """A vllm package with a garbage core extension and a real extension whose fat binary is damaged."""
    package = base / "site" / "vllm"
    (package / "platforms").mkdir(parents=True)
    (package / "plugins").mkdir()
    (package / "_version.py").write_text("__version__ = version = '0.32.0'\n")
    (package / "platforms" / "cuda.py").write_text("import vllm._C_stable_libtorch  # noqa\n")
    (package / "plugins" / "__init__.py").write_text("PLATFORM_PLUGINS_GROUP = 'vllm.platform_plugins'\n")
    (package / "_C_stable_libtorch.abi3.so").write_bytes(b"not a shared object" * 100)
    image = bytearray((Path(SITE) / "vllm" / "_qutlass_C.abi3.so").read_bytes())
    magic = image.find((0xBA55ED50).to_bytes(4, "little"))
    image[magic : magic + 4] = b"\x00\x11\x22\x33"
    (package / "_qutlass_C.abi3.so").write_bytes(bytes(image))
    return package


def test_damaged_vllm_extensions_are_findings(pods, doctor, tmp_path: Path) -> None:
    package = _fake_vllm(tmp_path)
    run = doctor(pods("bare"), "--json", "--vllm-dir", str(package))
    report = run.report
    assert run.returncode == 1 and report["vllm"]["package_dir"] == str(package)
    unreadable = run.finding("consumer-unreadable", "vllm._C_stable_libtorch")
    assert unreadable["severity"] == "error" and "not an ELF file (bad magic)" in unreadable["detail"]
    fatbin = run.finding("fatbin-unreadable", "vllm._qutlass_C")
    assert fatbin["severity"] == "warning" and "bad fat binary magic" in fatbin["detail"]
    assert [f["subject"] for f in report["findings"] if f["id"] == "fatbin-unreadable"] == ["vllm._qutlass_C"]
    assert consumer(report, "vllm._qutlass_C")["needs"] == ["cuTensorMapEncodeTiled"]  # its .dynsym is fine


def test_missing_vllm_is_a_finding(pods, doctor, tmp_path: Path) -> None:
    """A Python whose sys.path has everything but vLLM: the interpreter without site-packages (-S), and a
    directory of links to every site-packages entry except vllm's on PYTHONPATH."""
    shadow = tmp_path / "no-vllm"
    shadow.mkdir()
    for name in os.listdir(SITE):
        if not name.startswith("vllm") or name.startswith("vllm_tmaguard"):
            (shadow / name).symlink_to(Path(SITE) / name)
    run = doctor(pods("vcuda"), "--json", env={"PYTHONPATH": str(shadow)}, python=(sys.executable, "-S"))
    report = run.report
    assert run.returncode == 1 and report["vllm"]["found"] is False
    finding = run.finding("vllm-missing")
    assert finding["severity"] == "error" and "--vllm-dir" in finding["fix"]["text"]
    assert report["gpu"]["gpus"][0]["name"] == "NVIDIA GeForce RTX 4090"  # NVML child found pynvml
    assert consumer(report, "triton")["lacks"]  # the other consumers are still checked
    assert report["architectures"]["extensions"] == []


def test_guard_record_is_reported(pods, doctor, tmp_path: Path) -> None:
    pod = pods("vcuda")
    env = scrubbed_environ(_PRINTING) | pod.env
    check = subprocess.run(
        [sys.executable, "-m", "vllm_tmaguard", "check", "--json"], env=env, capture_output=True, text=True
    )
    record = json.loads(check.stdout)
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "last.json").write_text(json.dumps(record))
    run = doctor(pod, "--json")
    assert run.report["record"]["found"] and run.report["record"]["record"]["summary"] == record["summary"]
    assert run.finding("record")["severity"] == "info" and run.returncode == 0

    record["failed"] = ["could not load the overlay: read-only file system"]
    record["libcuda"]["path"] = "/elsewhere/libcuda.so.1"
    (tmp_path / "records" / "last.json").write_text(json.dumps(record))
    run = doctor(pod, "--json")
    finding = run.finding("record")
    assert finding["severity"] == "warning" and run.returncode == 1
    assert "read-only file system" in finding["detail"] and "/elsewhere/libcuda.so.1" in finding["detail"]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--nvml-timeout", "0"], {}, "argument --nvml-timeout: 0 is too small"),
        (["--nvml-timeout", "soon"], {}, "'soon' is not a number of seconds"),
        (["--vllm-dir", "/nonexistent"], {}, "'/nonexistent' is not a directory"),
        (["--frobnicate"], {}, "unrecognized arguments: --frobnicate"),
        (
            [],
            {"TMAGUARD_MODE": "fix-it"},
            "TMAGUARD_MODE='fix-it' is not valid; allowed: auto | validate | off",
        ),
    ],
)
def test_usage_errors_exit_2(pods, doctor, args: list[str], env: dict[str, str], message: str) -> None:
    run = doctor(pods("bare"), *args, env=env)
    assert run.returncode == 2 and run.stdout == "" and message in run.stderr


def test_console_script_and_help(pods) -> None:
    script = Path(sys.executable).parent / "tmaguard"
    env = scrubbed_environ(_PRINTING) | pods("bare").env
    done = subprocess.run([str(script), "doctor", "--help"], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "Exit status: 0 healthy, 1 problems found, 2 usage error" in done.stdout
    done = subprocess.run([str(script), "doctor", "--json"], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and json.loads(done.stdout)["schema"] == "tmaguard.doctor/1"
    listed = subprocess.run([str(script), "--help"], env=env, capture_output=True, text=True).stdout
    assert "doctor" in listed and "check" in listed


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
    assert guarded["guard"]["actions"][0].startswith("loaded the overlay ")
    binding = guarded["binding"]
    assert binding["encode"]["result"] == 0 and binding["bound_from"].endswith("/libcuda.so.1")
    assert "overlay-" in binding["bound_from"]  # the guard's overlay answered, not the layer
    assert binding["shim_source_means"] == "the layer's cuGetProcAddress"
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
    assert failed["severity"] == "error" and "returned 801 (CUDA_ERROR_NOT_SUPPORTED)" in failed["title"]
