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
from faultkit import GUARD_ONLY, RESOLVE, Result
from podkit import QUICK_EXIT, Pod, build_pod, scrubbed_environ

from vllm_tmaguard.stages.catalogue import OVERLAY_FILE

GUARD_DIR = Path(__import__("vllm_tmaguard").__file__).parent


@pytest.fixture
def image() -> Iterator[tuple[Path, Pod]]:
    """A world-traversable directory holding an OpenShift-style copy of the package (group 0, g=u) and a
    vCUDA pod, so that an arbitrary user can run from it."""
    assert os.geteuid() == 0, "running as an arbitrary uid needs root: run the suite as root"
    base = Path(tempfile.mkdtemp(prefix="tmaguard-openshift-", dir="/tmp"))
    shutil.copytree(GUARD_DIR, base / "site" / "vllm_tmaguard", ignore=shutil.ignore_patterns("__pycache__"))
    pod = build_pod(base / "pods", "vcuda", gpu_name="NVIDIA H100 80GB HBM3", cc="9.0")
    for path in [base, *base.rglob("*")]:
        if not path.is_symlink():
            os.chown(path, 0, 0)
            mode = stat.S_IMODE(path.stat().st_mode)
            path.chmod(mode | (mode & 0o700) >> 3)  # g=u
    yield base, pod
    shutil.rmtree(base)


def run_as_arbitrary_user(image: tuple[Path, Pod], code: str = RESOLVE) -> tuple[Result, dict]:
    """The vLLM platform import (or `code`) as an arbitrary uid in group 0; (the run, its guard record)."""
    base, pod = image
    uid = 1000680000 + random.randrange(10000)  # OpenShift's range; fresh, so its record dir is too
    # torch's compile cache would be /tmp/torchinductor_uid_<uid>, one more for every run: the image's own
    env = {**scrubbed_environ(), **pod.env, "PYTHONPATH": str(base / "site"), "HOME": "/tmp"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(base / "torchinductor")
    env.pop("TMAGUARD_RECORD_DIR", None)  # the uid's default, fresh: not the suite's (root's)
    user = ("setpriv", f"--reuid={uid}", "--regid=0", "--clear-groups", "--")
    command = [*user, sys.executable, "-c", code + QUICK_EXIT]
    records = Path(f"/tmp/tmaguard-{uid}")
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd="/tmp")
        run = Result(done.returncode, done.stdout, done.stderr, records)
        return run, run.last_record()
    finally:
        shutil.rmtree(records, ignore_errors=True)


def test_group_writable_install_loads_the_overlay(image: tuple[Path, Pod]) -> None:
    run, record = run_as_arbitrary_user(image)
    assert run.outcome == {"platform": "NvmlCudaPlatform"}, (run.stdout, run.stderr)
    assert [a["kind"] for a in record["actions"]][:1] == ["load-overlay"], record["actions"]
    assert record["problems"] == [] and record["outcome"] == "supplied", record


@pytest.mark.parametrize("weakness", ["writable by others", "writable by another group"])
def test_a_library_more_writable_than_the_package_is_refused(image: tuple[Path, Pod], weakness: str) -> None:
    library = image[0] / "site/vllm_tmaguard/lib" / OVERLAY_FILE
    if weakness == "writable by others":
        library.chmod(0o777)
        why = f"{library} is writable by others (mode 0777), which this package's own code is not"
    else:
        os.chown(library, 0, 1234)
        why = f"{library} is writable by group 1234 (mode 0775), which this package's own code is not"
    # What the guard loads is decided in its activation: vLLM's start in the first case, the guard alone in
    # the other (the same shims loaded, with which vLLM then starts as in the first).
    starts_vllm = weakness == "writable by others"
    run, record = run_as_arbitrary_user(image, RESOLVE if starts_vllm else GUARD_ONLY)
    (problem,) = record["problems"]
    assert (problem["code"], problem["cause"]) == (
        "overlay-failed",
        f"could not load the overlay: refused: {why}",
    )
    # The shims are as writable as the code, so they load and vLLM starts.
    assert [(a["kind"], a["target"]) for a in record["actions"]][:1] == [("load-shim", "encoders")]
    assert not starts_vllm or run.outcome == {"platform": "NvmlCudaPlatform"}
    assert "could not load the overlay" in run.line()
