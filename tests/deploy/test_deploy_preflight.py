"""The preflight script the container runs, executed with stand-in commands, and once with the real
`tmaguard` on an emulated vCUDA pod."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from deploykit import find


def _write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _write_preflight(rendered, tmp_path: Path) -> Path:
    """The vcuda overlay's preflight.sh, as the rendered ConfigMap carries it, written to a file."""
    script = tmp_path / "preflight.sh"
    script.write_text(
        find(rendered["overlays/vcuda"], "ConfigMap", "tmaguard-preflight")["data"]["preflight.sh"]
    )
    return script


@pytest.fixture
def preflight(rendered, tmp_path):
    """Runs the vcuda overlay's preflight.sh with stand-in `tmaguard` and `vllm` commands."""
    script = _write_preflight(rendered, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _write_executable(
        bin_dir / "tmaguard",
        "#!/bin/sh\n"
        'if [ "$1" = env ]; then\n'
        '  echo "# vcuda: lacks cuTensorMapEncodeTiled"; [ "$FAKE_ENV_EXIT" = 0 ] || exit "$FAKE_ENV_EXIT"\n'
        '  mkdir -p "$3" && : > "$3/libcuda.so.1"; exit 0\n'
        "fi\n"
        'echo "$@" > "$FAKE_DOCTOR_ARGS"\n'
        'cat "$FAKE_DOCTOR_JSON"; [ -z "${FAKE_DOCTOR_STDERR:-}" ] || echo "$FAKE_DOCTOR_STDERR" >&2\n'
        'exit "$FAKE_DOCTOR_EXIT"\n',
    )
    _write_executable(
        bin_dir / "vllm", '#!/bin/sh\nprintf "%s\\n" "$LD_LIBRARY_PATH" "$@" > "$FAKE_VLLM_OUT"\n'
    )
    report = {
        "status": "problems",
        "saved": {"path": str(tmp_path / "records/doctor.json"), "error": None},
        "findings": [
            {"severity": "info", "title": "GPU-sharing layer: vcuda", "fix": None},
            {
                "severity": "error",
                "title": "cuTensorMapEncodeTiled: the guard is off",
                "fix": {"text": "Set TMAGUARD_MODE=auto."},
            },
        ],
    }
    (tmp_path / "doctor.json").write_text(json.dumps(report))

    def run(*, doctor_exit=0, env_exit=0, strict="0", overlay=True, stderr="", **extra):
        env = {
            "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "TMAGUARD_STRICT": strict,
            "TMAGUARD_RECORD_DIR": str(tmp_path / "records"),
            "PREFLIGHT_TERMINATION_LOG": str(tmp_path / "termination-log"),
            "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64",
            "FAKE_ENV_EXIT": str(env_exit),
            "FAKE_DOCTOR_EXIT": str(doctor_exit),
            "FAKE_DOCTOR_JSON": str(tmp_path / "doctor.json"),
            "FAKE_DOCTOR_ARGS": str(tmp_path / "doctor.args"),
            "FAKE_DOCTOR_STDERR": stderr,
            "FAKE_VLLM_OUT": str(tmp_path / "vllm.out"),
            **({"PREFLIGHT_OVERLAY_DIR": str(tmp_path / "overlay")} if overlay else {}),
            **extra,
        }
        for stale in ("vllm.out", "termination-log"):
            (tmp_path / stale).unlink(missing_ok=True)
        (tmp_path / "termination-log").write_text("")  # the kubelet's file: appended to, never created
        done = subprocess.run(
            ["/bin/sh", str(script), "Qwen/x", "--port=8000"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,  # not the repository root: its source tree would be importable as the package
        )
        vllm = (tmp_path / "vllm.out").read_text().splitlines() if (tmp_path / "vllm.out").exists() else None
        termination = (tmp_path / "termination-log").read_text() or None
        return done, vllm, termination

    return run


def test_preflight_installs_the_overlay_runs_the_doctor_and_execs_vllm(preflight, tmp_path) -> None:
    for volume in ("records", "overlay"):  # as kubelet creates emptyDir volumes
        (tmp_path / volume).mkdir()
        (tmp_path / volume).chmod(0o777)
    done, vllm, termination = preflight()
    assert done.returncode == 0 and termination is None, done.stderr
    assert stat.S_IMODE((tmp_path / "records").stat().st_mode) == 0o700
    assert vllm == [f"{tmp_path}/overlay:/usr/local/nvidia/lib64", "serve", "Qwen/x", "--port=8000"]
    assert (tmp_path / "overlay/libcuda.so.1").exists()
    # The report is written by the doctor itself, through the guard's checks: never by a shell redirect.
    assert (tmp_path / "doctor.args").read_text().split() == ["doctor", "--json", "--save"]
    assert not (tmp_path / "records/doctor.json").exists()
    assert "tmaguard env: # vcuda: lacks cuTensorMapEncodeTiled" in done.stderr
    assert f"doctor: healthy (report: {tmp_path}/records/doctor.json)" in done.stderr
    # Already first on the path (the manifest's LD_LIBRARY_PATH): not added twice.
    done, vllm, _ = preflight(LD_LIBRARY_PATH=f"{tmp_path}/overlay:/usr/local/nvidia/lib64")
    assert vllm[0] == f"{tmp_path}/overlay:/usr/local/nvidia/lib64"
    # Without the overlay variable (base, hami): the library path is left alone.
    done, vllm, _ = preflight(overlay=False)
    assert vllm[0] == "/usr/local/nvidia/lib64"


def test_preflight_problems_are_logged_and_vllm_starts_unless_strict(preflight) -> None:
    done, vllm, termination = preflight(doctor_exit=1)
    assert done.returncode == 0 and vllm and termination is None
    assert (
        "doctor: error: cuTensorMapEncodeTiled: the guard is off. Fix: Set TMAGUARD_MODE=auto." in done.stderr
    )

    done, vllm, termination = preflight(doctor_exit=1, strict="1")
    assert done.returncode == 1 and vllm is None
    assert termination.startswith("tmaguard preflight (TMAGUARD_STRICT=1) stopped start-up: doctor: error: ")
    assert "Fix: Set TMAGUARD_MODE=auto." in termination

    message = "error: argument --nvml-timeout: 'x' is not a number of seconds"
    done, vllm, termination = preflight(doctor_exit=2, strict="1", stderr=message)
    assert done.returncode == 1 and vllm is None and message in termination and message in done.stderr
    assert "doctor could not run: usage error (exit 2)" in termination

    message = "tmaguard doctor: internal error: KeyError: 'x'"
    done, vllm, termination = preflight(doctor_exit=3, strict="1", stderr=message)
    assert done.returncode == 1 and vllm is None and message in termination
    assert "it failed itself (exit 3, not a diagnosis)" in termination
    done, vllm, termination = preflight(doctor_exit=3, stderr=message)
    assert done.returncode == 0 and vllm and termination is None and "doctor: error" not in done.stderr

    done, vllm, termination = preflight(env_exit=1, strict="1")
    assert done.returncode == 1 and vllm is None and "could not install the overlay" in termination
    done, vllm, termination = preflight(env_exit=1)
    assert done.returncode == 0 and vllm and termination is None
    assert vllm[0] == "/usr/local/nvidia/lib64"  # a refused overlay directory is not put on the path


def test_preflight_without_tmaguard_in_the_image(preflight, tmp_path) -> None:
    (tmp_path / "bin/tmaguard").unlink()
    done, vllm, termination = preflight(PATH=f"{tmp_path}/bin:/usr/bin:/bin")
    assert done.returncode == 0 and vllm and "no vllm-tmaguard in this image" in done.stderr
    done, vllm, termination = preflight(strict="1", PATH=f"{tmp_path}/bin:/usr/bin:/bin")
    assert done.returncode == 1 and vllm is None and "deploy/Dockerfile" in termination


def test_preflight_with_the_real_tmaguard_on_an_emulated_vcuda_pod(rendered, pods, tmp_path) -> None:
    """The vcuda overlay's recipe end to end: the real `tmaguard env` installs the overlay, and a process
    that loads libcuda.so.1 itself (no guard, as torch imported first would) gets the overlay in front of
    the layer, with what the layer lacks on libcuda.so.1's own handle."""
    tmaguard = Path(sys.executable).parent / "tmaguard"
    assert tmaguard.exists(), "the package's console script is missing: run scripts/setup_env.sh"
    pod = pods("vcuda")
    script = _write_preflight(rendered, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _write_executable(
        bin_dir / "vllm",
        f"#!{sys.executable}\n"
        "import ctypes, json, os, sys\n"
        "handle = ctypes.CDLL('libcuda.so.1')\n"
        "names = ('cuTensorMapEncodeTiled', 'cuGetProcAddress_v2', 'cuLaunchKernelEx')\n"
        "maps = {line.split()[-1] for line in open('/proc/self/maps') if 'libcuda' in line}\n"
        "print('RESULT ' + json.dumps({'args': sys.argv[1:], 'maps': sorted(maps),\n"
        "    'handle': {n: hasattr(handle, n) for n in names}}))\n",
    )
    overlay_dir = tmp_path / "opt-tmaguard"
    env = {
        **{k: v for k, v in pod.environ().items() if not k.startswith(("TMAGUARD_", "PREFLIGHT_"))},
        **pod.env,
        "PATH": f"{bin_dir}:{tmaguard.parent}:/usr/bin:/bin",
        "PREFLIGHT_OVERLAY_DIR": str(overlay_dir),
        "LD_LIBRARY_PATH": f"{overlay_dir}:{pod.lib_dir}",  # what overlay-env.yaml sets, with the pod's paths
        "TMAGUARD_RECORD_DIR": str(tmp_path / "records"),
        "TMAGUARD_MODE": "off",  # no guard in this process: the installed overlay alone must do it
        "PREFLIGHT_TERMINATION_LOG": str(tmp_path / "termination-log"),
    }
    done = subprocess.run(
        ["/bin/sh", str(script), "m", "--port=8000"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["args"] == ["serve", "m", "--port=8000"]
    assert (
        str(overlay_dir / "libcuda.so.1") in result["maps"]
        and str(pod.lib_dir / "libcuda.so.1") in result["maps"]
    )
    assert all(result["handle"].values()), result["handle"]
    assert f"installed {overlay_dir}/libcuda.so.1" in done.stderr
    assert json.loads((tmp_path / "records/doctor.json").read_text())["schema"] == "tmaguard.doctor/2"
    assert f"(report: {tmp_path}/records/doctor.json)" in done.stderr

    # A restart of the container: the overlay is already first on the path; nothing to add, still works.
    again = subprocess.run(
        ["/bin/sh", str(script), "m"], env=env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and "is already the tmaguard overlay" in again.stderr, again.stderr


def test_preflight_on_the_stock_image(rendered, pods, stock_python, tmp_path) -> None:
    """vcuda-stock-image: vLLM's image has no `tmaguard` command; with the package injected on PYTHONPATH
    the preflight runs it as `python3 -m vllm_tmaguard` and installs the overlay the same way."""
    from test_no_rebuild import inject

    pod = pods("vcuda")
    injected = tmp_path / "opt-vllm-tmaguard"
    inject(injected)
    script = _write_preflight(rendered, tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _write_executable(bin_dir / "vllm", '#!/bin/sh\necho "RESULT $LD_LIBRARY_PATH"\n')
    overlay_dir = tmp_path / "opt-tmaguard"
    env = {
        **{k: v for k, v in pod.environ().items() if not k.startswith(("TMAGUARD_", "PREFLIGHT_"))},
        **pod.env,
        "PATH": f"{bin_dir}:{Path(stock_python).parent}:/usr/bin:/bin",
        "PYTHONPATH": str(injected),
        "PREFLIGHT_OVERLAY_DIR": str(overlay_dir),
        "LD_LIBRARY_PATH": f"{overlay_dir}:{pod.lib_dir}",
        "TMAGUARD_RECORD_DIR": str(tmp_path / "records"),
        "PREFLIGHT_TERMINATION_LOG": str(tmp_path / "termination-log"),
    }
    done = subprocess.run(
        ["/bin/sh", str(script), "m"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0 and "no vllm-tmaguard" not in done.stderr, done.stderr
    assert f"installed {overlay_dir}/libcuda.so.1" in done.stderr
    assert json.loads((tmp_path / "records/doctor.json").read_text())["schema"] == "tmaguard.doctor/2"
    assert f"RESULT {overlay_dir}:{pod.lib_dir}" in done.stdout
