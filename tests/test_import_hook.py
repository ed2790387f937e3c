"""The .pth import hook: covers vLLM versions whose CUDA extension is imported before any plugin runs."""

from __future__ import annotations

import os
import site
import subprocess
import sys

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
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[true, false]"
