"""What the doctor makes of faults: a hanging or failing NVML (asked with --active only), damaged or missing
files, a missing vLLM, the guard's record; and that the passive doctor never calls into the layer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from doctorkit import PRINTING, SITE, consumer
from faultkit import default_record_dir_at
from podkit import build_pod, scrubbed_environ

from vllm_tmaguard.doctor.findings.active import nvml_findings
from vllm_tmaguard.stages.vllm_probe import probe_vllm


def test_hanging_nvml_is_killed_and_reported(pods, doctor) -> None:
    mark = uuid.uuid4().hex
    run = doctor(
        pods("vcuda"),
        "--json",
        "--active",
        "--nvml-timeout",
        "0.5",
        "--active-timeout",  # the CUDA children ask the hanging NVML too: they need not run their full minute
        "2",
        env={"STANDIN_NVML_HANG": "1", "DOCTOR_TEST_MARK": mark},
    )
    report = run.report
    assert run.returncode == 1
    nvml = report["active_check"]["nvml"]["run"]
    assert nvml["timed_out"] and nvml["timeout_s"] == 0.5
    finding = run.finding("nvml-timeout")
    assert finding["severity"] == "error" and "0.5 s" in finding["title"]
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


def test_failing_nvml_is_a_finding_of_the_active_check_only(pods, doctor) -> None:
    pod = pods("vcuda")
    run = doctor(pod, "--json", "--active", env={"STANDIN_NVML_FAIL": "9"})
    finding = run.finding("nvml-error")
    # in a vCUDA pod libnvidia-ml.so.1 is the layer: its own error, as vLLM would get it
    assert run.returncode == 1 and "nvmlInit_v2: standin vCUDA NVML error (9)" in finding["detail"]
    passive = doctor(pod, "--json", env={"STANDIN_NVML_FAIL": "9"})
    assert "nvml-error" not in passive.ids("error") and passive.report["gpu"]["gpus"]


def test_crashed_nvml_query_is_explained() -> None:
    run = {"timeout_s": 5.0, "timed_out": False, "exit_status": 255, "elapsed_ms": 3.0, "stderr_tail": "bye"}
    (finding,) = nvml_findings({"result": None, "run": run})
    assert finding["id"] == "nvml-crashed" and finding["severity"] == "error"
    assert "the NVML query process exited with status 255 before answering: bye" in finding["detail"]


def test_the_passive_doctor_never_calls_into_the_layer(pods, doctor) -> None:
    """In a vCUDA pod libnvidia-ml.so.1 is the layer: its init registers the process with the node (and
    exits without its config). The passive doctor reads /proc/driver/nvidia instead."""
    pod = build_pod(Path(pods("bare").root).parent, "vcuda", vcuda_config=False)
    run = doctor(pod, "--json")
    assert run.report["gpu"]["gpus"][0]["name"] == "NVIDIA GeForce RTX 4090"
    assert run.report["gpu"]["source"] == "procfs"
    assert not (pod.root / "etc/vcuda/registrations").exists()


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
    assert report["gpu"]["gpus"][0]["name"] == "NVIDIA GeForce RTX 4090"  # from /proc/driver/nvidia
    assert consumer(report, "triton")["lacks"]  # the other consumers are still checked
    assert report["architectures"]["extensions"] == []


def test_guard_record_is_reported(pods, doctor, tmp_path: Path) -> None:
    pod = pods("vcuda")
    env = scrubbed_environ(PRINTING) | pod.env
    check = subprocess.run(
        [sys.executable, "-m", "vllm_tmaguard", "check", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    record = json.loads(check.stdout)
    (tmp_path / "records").mkdir(mode=0o700)
    (tmp_path / "records" / "last.json").write_text(json.dumps(record))
    run = doctor(pod, "--json")
    assert run.report["record"]["found"] and run.report["record"]["record"]["summary"] == record["summary"]
    assert run.finding("record")["severity"] == "info" and run.returncode == 0

    record["outcome"] = "degraded"
    record["problems"] = [
        {
            "code": "overlay-failed",
            "cause": "could not load the overlay: read-only file system",
            "consequence": "the shims stand in",
            "fix": "see `tmaguard doctor`",
            "symbol": None,
            "subject": None,
        }
    ]
    record["libcuda"]["path"] = "/elsewhere/libcuda.so.1"
    (tmp_path / "records" / "last.json").write_text(json.dumps(record))
    run = doctor(pod, "--json")
    finding = run.finding("record")
    assert finding["severity"] == "warning" and run.returncode == 1
    assert "read-only file system" in finding["detail"] and "/elsewhere/libcuda.so.1" in finding["detail"]


def _vllm_with_abi_copies_and_missing_files(base: Path) -> tuple[Path, list[Path]]:
    """A vllm package laid out like 0.25.1's: DeepGEMM's `_C` once per CPython ABI (3.10 ... 3.14), and a
    wheel RECORD that lists two extensions which are not on disk."""
    site = base / "site"
    package = site / "vllm"
    (package / "platforms").mkdir(parents=True)
    (package / "plugins").mkdir()
    (package / "_version.py").write_text("__version__ = version = '0.32.0'\n")
    (package / "platforms" / "cuda.py").write_text("import vllm._C_stable_libtorch  # noqa\n")
    (package / "plugins" / "__init__.py").write_text("PLATFORM_PLUGINS_GROUP = 'vllm.platform_plugins'\n")
    real = Path(SITE) / "vllm"
    (package / "_C_stable_libtorch.abi3.so").symlink_to(real / "_C_stable_libtorch.abi3.so")
    deep_gemm = package / "third_party" / "deep_gemm"
    deep_gemm.mkdir(parents=True)
    for minor in range(10, 15):
        name = f"_C.cpython-3{minor}-{sys.implementation._multiarch}.so"
        (deep_gemm / name).symlink_to(real / "_qutlass_C.abi3.so")  # NEEDED libcuda.so.1, an encoder user
    missing = [package / "_moe_C.abi3.so", package / "vllm_flash_attn" / "_vllm_fa3_C.abi3.so"]
    files = [*package.rglob("*.so"), *missing]
    record = site / "vllm-0.32.0.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("".join(f"{p.relative_to(site)},sha256=x,1\n" for p in files))
    return package, missing


def test_only_this_interpreters_abi_counts_and_missing_files_are_one_finding(pods, doctor, tmp_path) -> None:
    package, missing = _vllm_with_abi_copies_and_missing_files(tmp_path)
    run = doctor(pods("vcuda"), "--json", "--vllm-dir", str(package))
    report = run.report
    deep_gemm = [row for row in report["consumers"] if row["name"] == "vllm.third_party.deep_gemm._C"]
    own = f"_C.cpython-{sys.version_info.major}{sys.version_info.minor}-"
    assert len(deep_gemm) == 1 and os.path.basename(deep_gemm[0]["path"]).startswith(own), deep_gemm
    assert deep_gemm[0]["needs"] == ["cuTensorMapEncodeTiled"]
    modules = [e["module"] for e in report["architectures"]["extensions"]]
    assert modules.count("vllm.third_party.deep_gemm._C") == 1
    (finding,) = [f for f in report["findings"] if f["id"] == "consumers-missing"]
    assert finding["severity"] == "error" and finding["title"] == "2 extension files are missing"
    assert all(str(path) in finding["detail"] for path in missing)
    assert not [f for f in report["findings"] if f["id"] in ("consumer-unreadable", "fatbin-unreadable")]
    # The guard reads the same: one deep_gemm._C among the extensions whose needs it supplies.
    guard_view = probe_vllm(str(package))
    assert [e.module for e in guard_view.extensions].count("vllm.third_party.deep_gemm._C") == 1


def test_no_record_directory_at_all_is_said_in_the_header(pods, doctor, tmp_path: Path) -> None:
    """Issue 34: TMAGUARD_RECORD_DIR and the default directory both refused (open to everyone): the header
    said "Last record none at None". It says there is no record directory this user may read, and why."""
    shared, default = tmp_path / "shared", tmp_path / "default-records"  # the latter: /tmp/tmaguard-<uid>
    for directory in (shared, default):
        directory.mkdir()
        directory.chmod(0o777)
    python = (*default_record_dir_at(default), sys.executable)
    run = doctor(pods("bare"), env={"TMAGUARD_RECORD_DIR": str(shared), "COLUMNS": "400"}, python=python)
    assert run.returncode == 1, run.stdout + run.stderr
    (header,) = [line for line in run.stdout.splitlines() if line.startswith("Last record")]
    assert "None" not in header, header
    assert header.startswith("Last record   none: no record directory this user may read (")
    assert f"{shared} has mode 0777" in header and f"/tmp/tmaguard-{os.getuid()} has mode 0777" in header


def test_a_refused_record_directory_is_a_finding(pods, doctor, tmp_path: Path) -> None:
    """TMAGUARD_RECORD_DIR open to everyone: the guard refuses it and writes to its default directory; the
    doctor says so, and does not call the pod healthy when no record is there either."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    pod = pods("bare")
    default = tmp_path / "default-records"  # the process's /tmp/tmaguard-<uid>: not the user's own, empty
    default.mkdir(mode=0o700)
    python = (*default_record_dir_at(default), sys.executable)
    env = {"TMAGUARD_RECORD_DIR": str(shared), "HOME": str(tmp_path)}
    run = doctor(pod, "--json", env=env, python=python)
    assert run.report["record"]["found"] is False
    finding = run.finding("record-dir-refused")
    assert finding["severity"] == "warning" and run.returncode == 1
    assert f"{shared} has mode 0777: everyone can enter it" in finding["detail"]
    assert run.report["record"]["path"] == f"/tmp/tmaguard-{os.getuid()}/last.json"
