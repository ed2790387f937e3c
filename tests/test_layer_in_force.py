"""Issue 32 items 3 and 6 on emulated pods: a sharing layer configured but not in force, and which build of a
layer a pod has.

Item 3: HAMi-core, vgpu-manager and nvshare are preloaded; where the entry names a file the loader cannot
map, the real loader prints `ERROR: ld.so: object ... cannot be preloaded (...): ignored.` and the process
runs unmetered (each case below runs that loader and checks its words). The guard's record says the limits
are NOT in force, naming the entry, the file and why (degraded, its line says it first), the doctor says it
as an error with the fix, and `doctor --active` confirms it from its child's /proc/self/maps. Cases: a
missing file, a directory (HAMi #777), an unreadable file, a 32-bit or an aarch64 build, HAMi's limits with
its mounted library and no preload (and with CUDA_DISABLE_CONTROL=true, with which HAMi's device plugin
leaves /etc/ld.so.preload out), a library this process's loader did not map (LD_PRELOAD set after start),
and an entry needing a newer glibc (fatal to every process instead: layer-cannot-load).

Item 6: the record's `layer_files` (size, sha256 prefix, build ID, the compiler's version string) of the
library answering libcuda.so.1 (vCUDA) or the preloaded one (HAMi-core), replayed with the verdict."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import faultkit
import podkit
import pytest
from podkit import child_environ

# The guard's activation as vLLM's import hook runs it, without the rest of vLLM's start: for the tests whose
# part is the guard's record alone.
GUARD_ONLY = "from vllm_tmaguard.guard import activate\nactivate('import-hook')\nprint('RESULT {}')"
# After vLLM's import (the guard's run), what the process's own preload variable is.
PRELOAD_AFTER = "import json, os, vllm\nprint('RESULT ' + json.dumps(os.environ.get('LD_PRELOAD')))"


def tmaguard(pod: podkit.Pod, records: Path, *args: str, env=None, prefix=()) -> subprocess.CompletedProcess:
    """`python -m vllm_tmaguard ARGS` in a fresh process inside `pod` (its stderr: the loader's words)."""
    environ = child_environ(pod, records, env, ("COLUMNS", "NO_COLOR", "FORCE_COLOR"))
    command = [*prefix, sys.executable, "-m", "vllm_tmaguard", *args]
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=180)
    assert "Traceback" not in done.stderr, done.stderr
    podkit.guard_lines(done.stdout + "\n" + done.stderr)
    return done


def check(pod: podkit.Pod, records: Path, env=None, prefix=()) -> tuple[dict, str]:
    """The guard's stages in a fresh process (`tmaguard check --json`): its record, and the loader's words."""
    done = tmaguard(pod, records, "check", "--json", env=env, prefix=prefix)
    return json.loads(done.stdout), done.stderr


def doctor(pod: podkit.Pod, records: Path, *args: str, env=None) -> tuple[int, dict]:
    done = tmaguard(pod, records, "doctor", "--json", *args, env=env)
    return done.returncode, json.loads(done.stdout)


def findings(report: dict, finding_id: str) -> list[dict]:
    return [f for f in report["findings"] if f["id"] == finding_id]


def hami_library(pod: podkit.Pod) -> Path:
    return pod.root / "usr/local/vgpu/libvgpu.so"


def ignored(entry: str | Path, why: str) -> str:
    return f"ERROR: ld.so: object '{entry}' from LD_PRELOAD cannot be preloaded ({why}): ignored."


def gcc(tmp_path: Path, name: str, source: str, *flags: str) -> Path:
    (tmp_path / f"{name}.c").write_text(source)
    out = tmp_path / name
    done = subprocess.run(
        ["gcc", "-shared", "-fPIC", str(tmp_path / f"{name}.c"), *flags, "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"gcc {' '.join(flags)} cannot build {name} here: {done.stderr.strip()[-300:]}")
    return out


# ---------------------------------------------------------------------------------------------------------
# Item 3


def test_a_preload_naming_no_file_leaves_the_pod_unmetered_and_the_record_says_so(
    pods, run_python, tmp_path
) -> None:
    """The issue's case, as a new user tries it: HAMi's limit set, LD_PRELOAD naming no file (and no
    /etc/ld.so.preload). vLLM starts; the record is degraded, names the entry and why, its line says it
    first; the doctor says it as an error with the fix, and --active confirms it from its child."""
    pod = pods("hami", cc="9.0")
    (pod.root / "etc/ld.so.preload").unlink()
    entry = pod.root / "usr/local/vgpu/gone/libvgpu.so"
    env = {"LD_PRELOAD": str(entry), "CUDA_DEVICE_MEMORY_LIMIT_0": "8g"}
    run = run_python(pod, PRELOAD_AFTER, env)
    assert run.returncode == 0 and ignored(entry, "cannot open shared object file") in run.stderr
    record = run.last_record()
    assert record["outcome"] == "degraded" and record["layers"][0]["name"] == "hami"
    (problem,) = record["problems"]
    assert problem["code"] == "layer-not-in-force" and problem["subject"] == str(entry)
    assert problem["cause"] == f"HAMi-core's limits are NOT in force: {entry} (from LD_PRELOAD) is not there"
    assert problem["fix"].startswith(f"mount HAMi-core's library at {entry}")
    assert record["metering"] == [] and record["layer_files"] == []  # it meters nothing; no file to name
    assert record["actions"] == [] and run.result == str(entry)  # said, never fixed: nothing loaded or set
    (line,) = run.guard_lines()
    assert "ERROR" in line and "tmaguard: HAMi-core: configured but NOT in force (not loaded)" in line
    assert "PROBLEM: HAMi-core's limits are NOT in force" in line

    code, report = doctor(pod, tmp_path / "r", "--active", env=env)
    assert code == 1
    (error,) = findings(report, "layer-not-in-force")
    assert error["severity"] == "error" and error["subject"] == str(entry)
    assert error["fix"]["text"].startswith(f"Mount HAMi-core's library at {entry}")
    (confirmed,) = findings(report, "active-layer-not-in-force")
    assert confirmed["severity"] == "error" and confirmed["subject"] == "hami"
    assert ignored(entry, "cannot open shared object file") in confirmed["detail"]
    assert report["active_check"]["plain"]["result"]["preloads"] == [
        {"entry": str(entry), "source": "LD_PRELOAD", "layer": "hami", "mapped": False}
    ]


def test_doctor_active_confirms_a_layer_in_force(pods, tmp_path) -> None:
    """The same check on the pod as its device plugin lays it out: the child has libvgpu.so mapped."""
    code, report = doctor(pods("hami", cc="9.0"), tmp_path / "r", "--active")
    assert code == 0 and findings(report, "layer-not-in-force") == []
    (ok,) = findings(report, "active-layer-in-force")
    assert ok["severity"] == "ok" and ok["subject"] == "hami"


@pytest.mark.parametrize("switch", [True, False], ids=["CUDA_DISABLE_CONTROL=true", "no-preload"])
def test_hamis_limits_and_library_without_a_preload(pods, tmp_path, switch) -> None:
    """HAMi's device plugin sets the limits and mounts libvgpu.so, and with CUDA_DISABLE_CONTROL=true leaves
    /etc/ld.so.preload out (Project-HAMi/HAMi server.go): nothing preloads HAMi-core, nothing is metered.
    Before, no layer was named at all."""
    pod = pods("hami", cc="9.0")
    (pod.root / "etc/ld.so.preload").unlink()
    env = {"LD_PRELOAD": "", **({"CUDA_DISABLE_CONTROL": "true"} if switch else {})}
    code, report = doctor(pod, tmp_path / "r", env=env)
    assert code == 1 and report["layers"][0]["name"] == "hami"
    (error,) = findings(report, "layer-not-in-force")
    assert error["severity"] == "error" and "nothing preloads /usr/local/vgpu/libvgpu.so" in error["title"]
    if switch:
        assert error["subject"] == "CUDA_DISABLE_CONTROL" and "CUDA_DISABLE_CONTROL=true" in error["title"]
        assert error["fix"]["text"].startswith("Unset CUDA_DISABLE_CONTROL")
    else:
        assert error["subject"] == "/usr/local/vgpu/libvgpu.so"
        assert "/etc/ld.so.preload" in error["fix"]["text"]
    assert report["decision"]["outcome"] == "degraded"


@pytest.mark.parametrize("kind", ["vgpu-manager", "nvshare"])
def test_a_build_for_another_architecture(pods, tmp_path, kind) -> None:
    """vgpu-manager's libvgpu-control.so replaced by a 32-bit build (the loader: wrong ELF class), nvshare's
    libnvshare.so by one for aarch64 (the loader: cannot open shared object file): not in force."""
    pod = pods(kind, cc="9.0")
    entry = Path(pod.env["LD_PRELOAD"])
    if kind == "vgpu-manager":
        built = gcc(tmp_path, "libvgpu-control.so", "int control(void) { return 1; }\n", "-m32", "-nostdlib")
        shutil.copyfile(built, entry)
        loader, found = "wrong ELF class: ELFCLASS32", "is an ELFCLASS32 build, this process 64-bit"
    else:
        image = bytearray(entry.read_bytes())
        image[18:20] = (183).to_bytes(2, "little")  # e_machine: EM_AARCH64
        entry.write_bytes(bytes(image))
        loader, found = "cannot open shared object file", "is built for ARM aarch64"
    record, stderr = check(pod, tmp_path / "r")
    assert ignored(entry, loader) in stderr
    (problem,) = [p for p in record["problems"] if p["code"] == "layer-not-in-force"]
    assert f"{entry} (from LD_PRELOAD) {found}" in problem["cause"]
    assert problem["fix"].startswith("mount the build of") and "x86_64" in problem["fix"]
    assert record["outcome"] == "degraded"


def test_an_unreadable_library(pods, tmp_path) -> None:
    """libvgpu.so of mode 000 (the container's user cannot read it): the loader cannot open it."""
    pod = pods("hami", cc="9.0")
    hami_library(pod).chmod(0)
    record, stderr = check(pod, tmp_path / "r", prefix=faultkit.without_dac_override())
    assert ignored(pod.env["LD_PRELOAD"], "cannot open shared object file") in stderr
    (problem,) = record["problems"]
    assert problem["code"] == "layer-not-in-force"
    assert "cannot be read (Permission denied)" in problem["cause"]
    assert problem["fix"].startswith(f"make {pod.env['LD_PRELOAD']} readable")


def test_a_library_this_process_did_not_map(pods, run_python) -> None:
    """LD_PRELOAD set inside Python before the guard runs (at `import vllm`; here the guard alone, its
    record being the subject): the file would load, but this process's loader never mapped it, so its
    limits are not in force here. That verdict is this process's alone: a process started with the same
    LD_PRELOAD has the library mapped, runs the full run (no replay of the first), and finds it in force."""
    pod = pods("hami", cc="9.0")
    (pod.root / "etc/ld.so.preload").unlink()
    entry = pod.env["LD_PRELOAD"]
    late = f"import os\nos.environ['LD_PRELOAD'] = {entry!r}\n{GUARD_ONLY}"
    first = run_python(pod, late, {"LD_PRELOAD": ""})
    (problem,) = first.last_record()["problems"]
    assert problem["code"] == "layer-not-in-force"
    assert f"{entry} (from LD_PRELOAD) is not among" in problem["cause"]
    second = run_python(pod, GUARD_ONLY)
    record = second.last_record()
    assert record["replayed_from"] is None and record["problems"] == [] and record["outcome"] != "degraded"


STUB_VERSIONS = "GLIBC_2.2.5 { memset; };\nGLIBC_2.99 { tmaguard_newer_glibc; } GLIBC_2.2.5;\n"
STUB_LIBC = "void memset(void) {}\nvoid tmaguard_newer_glibc(void) {}\n"
NEEDS_NEWER = "extern void tmaguard_newer_glibc(void);\nvoid hook(void) { tmaguard_newer_glibc(); }\n"


def test_a_library_needing_a_newer_glibc_stops_every_process(pods, tmp_path) -> None:
    """A libvgpu.so linked against a glibc with GLIBC_2.99 (a stub libc.so.6 defining that version): the
    loader stops a process preloading it; the doctor, run where it is only in the pod's /etc/ld.so.preload
    (a debug copy), says so as layer-cannot-load."""
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "libc.map").write_text(STUB_VERSIONS)
    script = f"-Wl,--version-script={stub / 'libc.map'}"
    gcc(stub, "libc.so.6", STUB_LIBC, "-nostdlib", "-fno-builtin", "-Wl,-soname,libc.so.6", script)
    built = gcc(tmp_path, "libvgpu.so", NEEDS_NEWER, f"-L{stub}", "-l:libc.so.6")
    pod = pods("hami", cc="9.0")
    shutil.copyfile(built, hami_library(pod))
    preloading = {"LD_PRELOAD": str(hami_library(pod))}
    dies = subprocess.run(
        [sys.executable, "-c", "pass"], env=preloading, capture_output=True, text=True, timeout=300
    )
    assert dies.returncode != 0
    assert f"version `GLIBC_2.99' not found (required by {hami_library(pod)})" in dies.stderr
    code, report = doctor(pod, tmp_path / "r", env={"LD_PRELOAD": ""})
    assert code == 1
    (error,) = findings(report, "layer-cannot-load")
    assert error["subject"] == "/usr/local/vgpu/libvgpu.so"
    assert "needs GLIBC_2.99, newer than this glibc" in error["title"]
    assert error["fix"]["text"].startswith("Mount a build of HAMi-core's library linked against this image's")


# ---------------------------------------------------------------------------------------------------------
# Item 6


def _identity(path: Path) -> dict:
    notes = subprocess.run(
        ["readelf", "-n", str(path)], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    build_id = notes.split("Build ID:")[1].split()[0]
    return {"size": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:12],
            "build_id": build_id}  # fmt: skip


def test_the_layers_library_identity_in_the_record_and_the_doctor(pods, tmp_path) -> None:
    """vCUDA: the library answering libcuda.so.1; the doctor shows it."""
    pod = pods("vcuda", cc="9.0")
    _, report = doctor(pod, tmp_path / "r")
    (library,) = report["decision"]["layer_files"]
    path = pod.lib_dir / "libcuda.so.1"
    assert library["layer"] == "vcuda" and library["path"] == str(path)
    assert {k: library[k] for k in ("size", "sha256", "build_id")} == _identity(path)
    assert library["versions"] and library["versions"][0].startswith("GCC: ")  # the compiler that built it
    (shown,) = findings(report, "layer-library")
    assert library["sha256"] in shown["detail"] and library["build_id"] in shown["detail"]


def test_the_preloaded_librarys_identity_is_replayed_with_the_verdict(pods, run_python) -> None:
    """HAMi-core: the preloaded file; read in the full run, kept by the replay."""
    pod = pods("hami", cc="9.0")
    first, second = (run_python(pod, GUARD_ONLY).last_record() for _ in range(2))
    assert second["replayed_from"] == first["pid"]
    (library,) = first["layer_files"]
    assert library["path"] == pod.env["LD_PRELOAD"] and second["layer_files"] == [library]
    assert {k: library[k] for k in ("size", "sha256", "build_id")} == _identity(Path(pod.env["LD_PRELOAD"]))
