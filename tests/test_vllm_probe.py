"""What the guard counts as a vLLM extension that needs libcuda.so.1: only files this interpreter can load
(vLLM 0.25.1 ships deep_gemm's `_C` once per CPython ABI), and only files that are there (a file the wheel's
RECORD lists but an image trimmed away cannot be loaded, so it needs nothing)."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

from vllm_tmaguard.vllm_probe import loadable_here, probe_vllm

HERE = sysconfig.get_config_var("EXT_SUFFIX")  # e.g. .cpython-311-x86_64-linux-gnu.so


def test_only_this_interpreters_abi_and_present_files_count(tmp_path: Path, standins) -> None:
    site = tmp_path / "site"
    package = site / "vllm"
    (package / "third_party/deep_gemm").mkdir(parents=True)
    (package / "_version.py").write_text("__version__ = version = '0.25.1'\n")
    probe = standins["driver_calls_ext"]  # a real extension: NEEDED libcuda.so.1, U cu* names
    listed = ["vllm/_C_stable_libtorch.abi3.so", "vllm/_moe_C.abi3.so"]  # the second is missing
    shutil.copy(probe, package / "_C_stable_libtorch.abi3.so")
    for minor in range(10, 15):
        name = f"vllm/third_party/deep_gemm/_C.cpython-3{minor}-x86_64-linux-gnu.so"
        shutil.copy(probe, site / name)
        listed.append(name)
    (site / "vllm-0.25.1.dist-info").mkdir()
    (site / "vllm-0.25.1.dist-info/RECORD").write_text("".join(f"{n},sha256=x,1\n" for n in listed))

    facts = probe_vllm(str(package))
    modules = {e.path.removeprefix(f"{site}/"): e.error for e in facts.extensions}
    assert modules == {
        "vllm/_C_stable_libtorch.abi3.so": None,
        f"vllm/third_party/deep_gemm/_C{HERE}": None,
    }
    assert all(e.driver_symbols for e in facts.extensions)


def test_loadable_here() -> None:
    assert loadable_here(f"/x/_C{HERE}") and loadable_here("/x/_C.abi3.so") and loadable_here("/x/libfoo.so")
    assert not loadable_here("/x/_C.cpython-39-x86_64-linux-gnu.so")
    assert not loadable_here("/x/_C.cpython-314t-x86_64-linux-gnu.so")
