"""OpenShift-style images: the install is `chmod -R g=u` and the pod runs as an arbitrary user in group 0.
The trust rule (trust.py, docs/SECURITY.md): a library the guard loads may be as writable as the package code
that loads it, never more. Real processes under setpriv with an arbitrary uid, vLLM 0.32.0's real binaries,
an emulated vCUDA pod."""

from __future__ import annotations

import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultkit import RESOLVE, Result
from podkit import build_pod, scrubbed_environ

GUARD_DIR = Path(__import__("vllm_tmaguard").__file__).parent
OVERLAY = "libtmaguard_overlay_enc-pa2-lex.so"  # the variant for a vCUDA layer


@pytest.fixture
def image() -> Iterator[Path]:
    """A world-traversable directory holding an OpenShift-style copy of the package (group 0, g=u) and a
    vCUDA pod, so that an arbitrary user can run from it."""
    assert os.geteuid() == 0, "running as an arbitrary uid needs root: run the suite as root"
    base = Path(tempfile.mkdtemp(prefix="tmaguard-openshift-", dir="/tmp"))
    shutil.copytree(GUARD_DIR, base / "site" / "vllm_tmaguard", ignore=shutil.ignore_patterns("__pycache__"))
    build_pod(base / "pods", "vcuda", gpu_name="NVIDIA H100 80GB HBM3", cc="9.0")
    for path in [base, *base.rglob("*")]:
        if not path.is_symlink():
            os.chown(path, 0, 0)
            mode = stat.S_IMODE(path.stat().st_mode)
            path.chmod(mode | (mode & 0o700) >> 3)  # g=u
    yield base
    shutil.rmtree(base)


def run_as_arbitrary_user(image: Path) -> tuple[Result, dict]:
    """The vLLM platform import as an arbitrary uid in group 0; (the run, its guard record)."""
    uid = 1000680000 + random.randrange(10000)  # OpenShift's range; fresh, so its record dir is too
    (pod,) = (image / "pods").iterdir()
    env = {
        **scrubbed_environ(),
        "PYTHONPATH": str(image / "site"),
        "LD_LIBRARY_PATH": str(pod / "usr/local/nvidia/lib64"),
        "TMAGUARD_ROOT": str(pod),
        "STANDIN_NVML_NAME": "NVIDIA H100 80GB HBM3",
        "STANDIN_NVML_CC": "9.0",
        "STANDIN_NVML_DRIVER": "550.142",
        "STANDIN_NVML_COUNT": "1",
        "HOME": "/tmp",
    }
    user = ("setpriv", f"--reuid={uid}", "--regid=0", "--clear-groups", "--")
    command = [*user, sys.executable, "-c", RESOLVE]
    records = Path(f"/tmp/tmaguard-{uid}")
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd="/tmp")
        run = Result(done.returncode, done.stdout, done.stderr, records)
        return run, run.last_record()
    finally:
        shutil.rmtree(records, ignore_errors=True)


def test_group_writable_install_loads_the_overlay(image: Path) -> None:
    run, record = run_as_arbitrary_user(image)
    assert run.outcome == {"platform": "NvmlCudaPlatform"}, (run.stdout, run.stderr)
    assert any(action.startswith("loaded the overlay") for action in record["actions"]), record["actions"]
    assert record["failed"] == [] and "FAILED" not in run.line()


@pytest.mark.parametrize("weakness", ["writable by others", "writable by another group"])
def test_a_library_more_writable_than_the_package_is_refused(image: Path, weakness: str) -> None:
    library = image / "site/vllm_tmaguard/lib" / OVERLAY
    if weakness == "writable by others":
        library.chmod(0o777)
        why = f"{library} is writable by others (mode 0777), which this package's own code is not"
    else:
        os.chown(library, 0, 1234)
        why = f"{library} is writable by group 1234 (mode 0775), which this package's own code is not"
    run, record = run_as_arbitrary_user(image)
    assert f"could not load the overlay: refused: {why}; falling back to the shims" in record["failed"]
    assert "loaded libtmaguard_encoders.so" in record["actions"]  # as writable as the code: vLLM starts
    assert run.outcome == {"platform": "NvmlCudaPlatform"} and "FAILED" in run.line()
