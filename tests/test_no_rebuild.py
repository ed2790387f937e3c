"""The no-rebuild path (docs/operator.md): vLLM's image as it ships (vLLM in its site-packages, this package
absent), the package placed by `tmaguard inject` in a directory on PYTHONPATH, as the manifests' init
container does. The guard must take the same place in start-up as a pip install: same decisions, same
record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from podkit import Run
from test_guard_vllm import RESOLVE_PLATFORM

# What a record holds that differs from process to process, whatever installed the guard.
PER_PROCESS = ("pid", "time", "timings_ms", "elapsed_ms", "record_file")


def _decisions(run: Run) -> dict:
    """The record without what differs per process, its own record directory named alike."""
    record = {k: v for k, v in run.last_record().items() if k not in PER_PROCESS}
    return json.loads(json.dumps(record).replace(str(run.record_dir), "<record dir>"))


def inject(target: Path) -> None:
    """The init container's command: `tmaguard inject DIR`, run with a Python that has the package."""
    done = subprocess.run(
        [sys.executable, "-m", "vllm_tmaguard", "inject", str(target)],
        capture_output=True,
        text=True,
        cwd=target.parent,  # not the repository root, whose source tree would shadow the installed package
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "PYTHONPATH" in done.stdout  # says what to set in the vLLM container


def test_the_stock_image_has_no_guard(pods, run_python, stock_python, tmp_path) -> None:
    run = run_python(pods("vcuda"), RESOLVE_PLATFORM, python=stock_python)
    assert run.result["error"].endswith("undefined symbol: cuTensorMapEncodeTiled")
    assert not (tmp_path / "records").exists()


@pytest.mark.parametrize("kind", ["vcuda", "bare"])
def test_injected_guard_decides_and_records_as_the_pip_install(
    pods, run_python, stock_python, tmp_path, kind
) -> None:
    pod = pods(kind)
    injected = tmp_path / "tmaguard"
    inject(injected)
    run = run_python(
        pod, RESOLVE_PLATFORM, {"PYTHONPATH": str(injected)}, python=stock_python, records="injected"
    )
    pip = run_python(pod, RESOLVE_PLATFORM, records="pip")
    assert "error" not in run.result, run.result
    assert run.result == pip.result  # the same platform and the same registered ops
    assert run.last_record()["trigger"] == "import-hook"  # armed at interpreter start, as by the .pth
    assert _decisions(run) == _decisions(pip)
    assert [line.split("] ", 1)[1].split("; details:")[0] for line in run.guard_lines()] == [
        line.split("] ", 1)[1].split("; details:")[0] for line in pip.guard_lines()
    ]


def test_torch_first_gets_the_overlay_too(pods, run_python, stock_python, tmp_path) -> None:
    """The case a plain PYTHONPATH copy misses: torch maps libcuda.so.1 before vLLM's plugins run; only a
    hook armed at interpreter start puts the overlay in front of it."""
    injected = tmp_path / "tmaguard"
    inject(injected)
    code = "import torch, vllm\n" + RESOLVE_PLATFORM
    run = run_python(pods("vcuda"), code, {"PYTHONPATH": str(injected)}, python=stock_python)
    assert "error" not in run.result, run.result
    record = run.last_record()
    assert record["trigger"] == "import-hook (torch imported first)"
    assert [a["kind"] for a in record["actions"]][:1] == ["load-overlay"]

    (injected / "sitecustomize.py").unlink()  # the package alone on PYTHONPATH: vLLM's plugin runs it late
    late = run_python(pods("vcuda"), code, {"PYTHONPATH": str(injected)}, python=stock_python, records="late")
    assert late.last_record()["trigger"] == "platform-plugin"
    assert "load-overlay" not in [a["kind"] for a in late.last_record()["actions"]]  # torch mapped the layer


def test_the_images_own_sitecustomize_still_runs(pods, run_python, stock_python, tmp_path) -> None:
    injected, theirs = tmp_path / "tmaguard", tmp_path / "image-site"
    inject(injected)
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITECUSTOMIZE'] = 'ran'\n")
    code = "import os\n" + RESOLVE_PLATFORM.replace(
        'print("RESULT "', 'out["image"] = os.environ.get("IMAGE_SITECUSTOMIZE")\nprint("RESULT "'
    )
    env = {"PYTHONPATH": f"{injected}{os.pathsep}{theirs}"}
    run = run_python(pods("vcuda"), code, env, python=stock_python)
    assert run.result["image"] == "ran" and "error" not in run.result, run.result
