"""The .pth import hook: covers vLLM versions whose CUDA extension is imported before any plugin runs."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest
from podkit import OLD_VLLM_IMPORT, build_old_vllm, expected_descriptor


def test_pth_file_is_installed_next_to_the_package() -> None:
    (pth,) = [p for d in site.getsitepackages() if os.path.exists(p := os.path.join(d, "vllm_tmaguard.pth"))]
    with open(pth) as file:
        assert file.read().strip() == "import vllm_tmaguard._import_hook"


def test_old_vllm_import_fails_without_guard(pods, run_python, tmp_path) -> None:
    old = build_old_vllm(tmp_path)
    run = run_python(pods("vcuda"), OLD_VLLM_IMPORT, {"PYTHONPATH": str(old), "TMAGUARD_MODE": "off"})
    assert (
        run.result["error"] == f"ImportError: {old}/vllm/_C.abi3.so: undefined symbol: cuTensorMapEncodeTiled"
    )


def test_old_vllm_import_works_through_the_pth_hook(pods, run_python, tmp_path) -> None:
    old = build_old_vllm(tmp_path)
    run = run_python(pods("vcuda"), OLD_VLLM_IMPORT, {"PYTHONPATH": str(old)})
    result = run.result
    assert result["version"] == "0.6.6.post1"
    status, descriptor = result["encode"]
    assert status == 0 and bytes.fromhex(descriptor) == expected_descriptor(7, 1, 0x1000, 4096, 1)
    record = run.last_record()
    assert record["trigger"] == "import-hook" and record["vllm"]["version"] == "0.6.6.post1"
    assert record["vllm"]["platform_plugins"] is False
    assert record["supplied"]["cuTensorMapEncodeTiled"] == "overlay"


def test_hook_does_nothing_until_vllm_is_imported() -> None:
    code = (
        "import sys, json; import vllm_tmaguard._import_hook as h; import json as j2, email.utils;"
        "print(json.dumps([h.VllmImportHook in sys.meta_path, 'vllm_tmaguard.guard' in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert done.stdout.strip() == "[true, false]"


# torch first, then vLLM (scripts, notebooks, workers that import torch first): torch initialises CUDA
# through libcuda.so.1 before vLLM's import hook would run.
TORCH_FIRST = """
import ctypes, json, os
import torch
torch.cuda.is_available()
maps = open("/proc/self/maps").read()
from vllm.platforms import current_platform
out = {"platform": type(current_platform).__name__}
out["overlay_is_libcuda"] = hasattr(ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD), "tmaguard_shim_source")
out["overlay_before_vllm"] = "/overlay-" in maps or "memfd:libcuda" in maps
print("RESULT " + json.dumps(out))
"""


def test_torch_imported_first_still_gets_the_overlay(pods, run_python) -> None:
    run = run_python(pods("vcuda", cc="9.0"), TORCH_FIRST)
    expected = {"platform": "NvmlCudaPlatform", "overlay_is_libcuda": True, "overlay_before_vllm": True}
    assert run.result == expected
    record = run.last_record()
    assert record["trigger"] == "import-hook (torch imported first)"
    assert record["libcuda"]["how"] == "LD_LIBRARY_PATH" and record["problems"] == []


def test_torch_first_on_a_complete_driver_leaves_the_guard_to_vllm(pods, run_python) -> None:
    code = "import json, sys, torch\nprint('RESULT ' + json.dumps('vllm_tmaguard.guard' in sys.modules))"
    assert run_python(pods("bare", cc="9.0"), code).result is False


@pytest.mark.parametrize(("kind", "needed"), [("vcuda", True), ("vcuda-v105", True), ("bare", False)])
def test_torch_first_question_reads_the_files_only(pods, kind, needed) -> None:
    from vllm_tmaguard.stages.early import guard_needed_before

    pod = pods(kind)
    assert guard_needed_before(pod.env) is needed
    assert guard_needed_before({**pod.env, "TMAGUARD_MODE": "off"}) is False
    assert str(pod.lib_dir) not in Path("/proc/self/maps").read_text()  # asking loaded nothing
