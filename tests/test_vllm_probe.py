"""What the guard counts as a vLLM extension that needs libcuda.so.1: only files this interpreter can load
(vLLM 0.25.1 ships deep_gemm's `_C` once per CPython ABI); a file the wheel's RECORD lists but an image
trimmed away is reported as missing, and is no fault of the guard's (nothing can load it)."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

from vllm_tmaguard.stages.scan_cache import load
from vllm_tmaguard.stages.vllm_probe import loadable_here, probe_vllm

HERE = sysconfig.get_config_var("EXT_SUFFIX")  # e.g. .cpython-311-x86_64-linux-gnu.so


def _fake_vllm(tmp_path: Path, standins) -> Path:
    """A vLLM 0.25.1 tree: its main extension, deep_gemm _C for CPython 3.10-3.14, a listed file absent."""
    site = tmp_path / "site"
    package = site / "vllm"
    (package / "third_party/deep_gemm").mkdir(parents=True)
    (package / "_version.py").write_text("__version__ = version = '0.25.1'\n")
    (package / "__init__.py").write_text("")
    probe = standins["driver_calls_ext"]  # a real extension: NEEDED libcuda.so.1, U cu* names
    listed = ["vllm/_C_stable_libtorch.abi3.so", "vllm/_moe_C.abi3.so"]  # the second is missing
    shutil.copy(probe, package / "_C_stable_libtorch.abi3.so")
    for minor in range(10, 15):
        name = f"vllm/third_party/deep_gemm/_C.cpython-3{minor}-x86_64-linux-gnu.so"
        shutil.copy(probe, site / name)
        listed.append(name)
    (site / "vllm-0.25.1.dist-info").mkdir()
    (site / "vllm-0.25.1.dist-info/RECORD").write_text("".join(f"{n},sha256=x,1\n" for n in listed))
    return site


def test_only_this_interpreters_abi_counts(tmp_path: Path, standins) -> None:
    site = _fake_vllm(tmp_path, standins)
    facts = probe_vllm(str(site / "vllm"))
    modules = {e.path.removeprefix(f"{site}/"): e.error for e in facts.extensions}
    assert modules == {
        "vllm/_C_stable_libtorch.abi3.so": None,
        "vllm/_moe_C.abi3.so": "No such file or directory",
        f"vllm/third_party/deep_gemm/_C{HERE}": None,
    }


def test_a_missing_extension_file_is_no_fault_of_the_guard(tmp_path, standins, pods, run_python) -> None:
    site = _fake_vllm(tmp_path, standins)
    run = run_python(pods("vcuda"), "import vllm\nprint('RESULT {}')", {"PYTHONPATH": str(site)})
    record = run.last_record()
    assert record["vllm"]["version"] == "0.25.1" and record["problems"] == [], record["problems"]
    assert record["missing"]["cuTensorMapEncodeTiled"] == [
        "vllm._C_stable_libtorch",
        "vllm.third_party.deep_gemm._C",
    ]
    # The scan is cached all the same (a slim image's missing files are part of what was scanned), and a
    # file appearing later is a change that makes the next process scan again.
    (cache,) = run.record_dir.glob("vllm-scan-*.json")
    scanned = json.loads(cache.read_text())["extensions"]
    assert [e["module"] for e in scanned if e["absent"]] == ["vllm._moe_C"]
    cached = load(str(run.record_dir), str(site / "vllm"))
    assert cached is not None and cached.version == "0.25.1"
    (site / "vllm/_moe_C.abi3.so").write_bytes(b"")
    assert load(str(run.record_dir), str(site / "vllm")) is None


def test_loadable_here() -> None:
    assert loadable_here(f"/x/_C{HERE}") and loadable_here("/x/_C.abi3.so") and loadable_here("/x/libfoo.so")
    assert not loadable_here("/x/_C.cpython-39-x86_64-linux-gnu.so")
    assert not loadable_here("/x/_C.cpython-314t-x86_64-linux-gnu.so")
