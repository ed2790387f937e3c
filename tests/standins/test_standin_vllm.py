"""vLLM extensions in the pods: the emulated 0.6 `_C`, and the installed 0.32 binaries."""

from __future__ import annotations

import ctypes.util
from pathlib import Path

import podkit
import pytest
from podkit import expected_descriptor
from standin_child import SITE, dynsym, run_child

OLD_IMPORT = """
try:
    import vllm
    out["version"] = vllm.__version__
    from importlib.metadata import version
    out["dist_version"] = version("vllm")
    out["probe"] = [vllm._C.encode_probe()[0].hex(), vllm._C.encode_probe()[1]]
    lib = ctypes.CDLL("libcuda.so.1")
    if has(lib, "standin_layer_calls"):
        out["layer_encoder_calls"] = counter(lib, "standin_layer_calls", "cuTensorMapEncodeTiled")
except ImportError as e:
    out["error"] = str(e)
"""


@pytest.mark.parametrize("kind", ["bare", "hami", "vcuda-fork", "vcuda", "vcuda-v105", "lupine", "nogpu"])
def test_old_vllm_extension(pods: dict[str, podkit.Pod], old_vllm: Path, kind: str) -> None:
    if kind == "nogpu" and ctypes.util.find_library("cuda"):
        pytest.fail("this host has its own libcuda.so.1: the no-GPU pod needs a host without one")
    out = run_child(pods[kind], OLD_IMPORT, extra={"PYTHONPATH": str(old_vllm)})
    if kind in ("bare", "hami", "vcuda-fork"):
        assert "error" not in out, out
        assert out["version"] == out["dist_version"] == "0.6.6.post1"
        # The first probe's descriptor (call number 1) and the second probe's result.
        assert out["probe"] == [expected_descriptor(7, 1, 0x1000, 4096, 1).hex(), 0]
        if kind == "vcuda-fork":
            assert out["layer_encoder_calls"] == 2
    elif kind == "nogpu":
        assert "libcuda.so.1: cannot open shared object file" in out["error"]
    else:
        assert "undefined symbol: cuTensorMapEncodeTiled" in out["error"]
        assert "_C.abi3.so" in out["error"]


def _vllm_extensions() -> list[Path]:
    root = SITE / "vllm"
    return sorted(root.rglob("*.so")) if root.is_dir() else []


def test_list_l_covers_what_vllm_and_torch_import(libs: dict[str, Path]) -> None:
    needed: set[str] = set()
    for so in [*_vllm_extensions(), *sorted((SITE / "torch/lib").glob("*.so*"))]:
        needed |= {s for s in dynsym(so, undefined=True) if s.startswith("cu") and s[2:3].isupper()}
    needed = {s for s in needed if not s.startswith("cuFile")}  # libcufile's, not the driver's
    assert "cuTensorMapEncodeTiled" in needed
    assert needed <= dynsym(libs["driver"])
    assert needed - dynsym(libs["layer"]) == {"cuTensorMapEncodeTiled", "cuGetProcAddress_v2"}


@pytest.mark.parametrize("kind", ["bare", "hami", "vcuda-fork", "vcuda", "lupine"])
def test_real_vllm_extension_in_pod(pods: dict[str, podkit.Pod], kind: str) -> None:
    exts = ["_C_stable_libtorch.abi3.so", "cumem_allocator.abi3.so", "vllm_flash_attn/_vllm_fa3_C.abi3.so"]
    out = run_child(
        pods[kind],
        f"""
        import torch  # noqa: F401 - the extensions need torch's libraries loaded
        site = {str(SITE / "vllm")!r}
        for ext in {exts!r}:
            try:
                ctypes.CDLL(os.path.join(site, ext), mode=os.RTLD_NOW)
                out[ext] = "ok"
            except OSError as e:
                out[ext] = str(e)
        """,
    )
    if kind in ("bare", "hami", "vcuda-fork"):
        assert set(out.values()) == {"ok"}, out
    else:
        assert "undefined symbol: cuTensorMapEncodeTiled" in out["_C_stable_libtorch.abi3.so"]
        assert "undefined symbol: cuTensorMapEncodeTiled" in out["vllm_flash_attn/_vllm_fa3_C.abi3.so"]
        assert out["cumem_allocator.abi3.so"] == "ok"
