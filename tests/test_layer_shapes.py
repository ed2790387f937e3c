"""Sharing-layer shapes seen in the field, on emulated pods with vLLM 0.32.0's real binaries and selectors:
the guard decides from what its overlay really reaches (the layer's own look-ups, a real driver wherever
the system keeps it), hands versioned entry points to callers of a layer that has no cuGetProcAddress,
and gets in front of libcuda.so.1 when torch is imported before vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from podkit import expected_descriptor
from test_guard_vllm import DRIVER_CALLS, RESOLVE_PLATFORM

SELECTORS = (Path(__file__).parent / "versions" / "probe.py").read_text()  # vLLM's real selectors
H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "cc": "9.0"}
# Where tmaguard_shim.c found an encoder (SOURCE_*).
LAYER_V2, LAYER_V1, REAL_DRIVER, NOWHERE = 1, 2, 3, -1


def test_layer_look_up_with_the_driver_elsewhere_keeps_the_tma_kernels(pods, run_python) -> None:
    """A layer exporting both cuGetProcAddress versions, the real driver where distributions keep it (not
    beside the layer): the encoder is reachable, so vLLM keeps Machete and FlashAttention-3."""
    pod = pods("vcuda-gpa-v2", **H100)
    run = run_python(pod, SELECTORS)
    assert "error" not in run.result, run.stderr[-3000:]
    record = run.record_of(run.result["pid"])
    assert run.result["w4a16"] == "MacheteLinearKernel" and run.result["fa"] == 3
    real = str(pod.real_driver)
    assert record["libcuda"]["real_driver"] == real
    assert record["tma"] == {
        "usable": True,
        "reason": "cuTensorMapEncodeTiled through the layer's cuGetProcAddress_v2, else the real driver "
        + real,
    }
    assert record["routing"]["disabled_kernels"] == [] and record["routing"]["blocked_imports"] == []


@pytest.mark.parametrize(
    ("kind", "source"),
    [
        ("vcuda", LAYER_V1),  # upstream vCUDA: its v1 look-up passes unknown names to the driver
        ("vcuda-noforward", REAL_DRIVER),  # its look-up refuses them: the driver file beside it
        ("vcuda-gpa-v2", LAYER_V2),
        ("vcuda-no-gpa", REAL_DRIVER),  # no look-up at all
    ],
)
def test_encoder_comes_from_where_the_record_says(pods, run_python, standins, kind, source) -> None:
    """At run time the encoder a vLLM extension binds is found where the decision said it would be, and
    it returns the real driver's descriptor."""
    pod = pods(kind, **H100)
    env = {"DRIVER_CALLS_DIR": str(standins["driver_calls_ext"].parent), "REAL_DRIVER": str(pod.real_driver)}
    run = run_python(pod, DRIVER_CALLS, env)
    assert "error" not in run.result, run.result
    status, descriptor = run.result["encode"]
    assert status == 0 and bytes.fromhex(descriptor) == expected_descriptor(7, 1, 0x7F0000001000, 4096, 1)
    assert run.result["encoder_source"] == source
    record = run.last_record()
    assert record["tma"]["usable"] is True and str(pod.real_driver) in record["tma"]["reason"]


ENCODE_ONLY = (
    RESOLVE_PLATFORM.replace('print("RESULT "', "#")
    + """
import os, sys
sys.path.insert(0, os.environ["DRIVER_CALLS_DIR"])
import driver_calls
out["encode"] = driver_calls.encode_tiled(0x7F0000001000, 4096)[0]
print("RESULT " + json.dumps(out))
"""
)


def test_network_layer_reaches_no_encoder_whatever_files_the_pod_has(pods, run_python, standins) -> None:
    pod = pods("lupine", **H100)
    env = {"DRIVER_CALLS_DIR": str(standins["driver_calls_ext"].parent), "REAL_DRIVER": "/nonexistent"}
    run = run_python(pod, SELECTORS)
    record = run.record_of(run.result["pid"])
    assert record["tma"] == {
        "usable": False,
        "reason": "lupine: no local driver to forward cuTensorMapEncodeTiled to",
    }
    assert record["libcuda"]["real_driver"] is None
    assert run_python(pod, ENCODE_ONLY, env).result["encode"] == 801  # CUDA_ERROR_NOT_SUPPORTED


def test_layer_without_cuGetProcAddress_fails_without_the_guard(pods, run_python) -> None:
    run = run_python(pods("vcuda-no-gpa", **H100), RESOLVE_PLATFORM, {"TMAGUARD_MODE": "off"})
    assert run.result["error"].startswith("ImportError: ") and "undefined symbol: cu" in run.result["error"]


# A caller of cuGetProcAddress_v2 as cudart and cuBLAS are (base names, their CUDA version, the per-thread
# stream flag) and as Triton is (the newer entry points): what each look-up gives, as the layer's export
# of that exact symbol, the overlay's own function, or an error with its status.
LOOK_UPS = """
import ctypes, json, os
from vllm.platforms import current_platform
type(current_platform).__name__
overlay = ctypes.CDLL("libcuda.so.1")
layer = ctypes.CDLL(os.environ["LAYER"], mode=os.RTLD_NOLOAD)
layer.standin_layer_calls.restype = ctypes.c_longlong
look_up = overlay.cuGetProcAddress_v2
look_up.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                    ctypes.POINTER(ctypes.c_int)]
def address(library, name):
    try:
        return ctypes.cast(getattr(library, name), ctypes.c_void_p).value
    except AttributeError:
        return None
def where(fn):
    for library, prefix in ((layer, "layer:"), (overlay, "overlay:")):  # the overlay handle sees both
        for name in json.loads(os.environ["NAMES"]):
            if fn is not None and address(library, name) == fn:
                return prefix + name
    return fn
out = {}
for name, version, flags in json.loads(os.environ["ASKS"]):
    fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
    result = look_up(name.encode(), ctypes.byref(fn), version, flags, ctypes.byref(status))
    out[f"{name} {version} {flags}"] = [result, status.value, where(fn.value)]
fn, status = ctypes.c_void_p(), ctypes.c_int()
look_up(b"cuMemAlloc", ctypes.byref(fn), 12000, 0, ctypes.byref(status))
before = layer.standin_layer_calls(b"cuMemAlloc_v2")
pointer = ctypes.c_uint64()
ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)(fn.value)(ctypes.byref(pointer), 4096)
out["metered"] = layer.standin_layer_calls(b"cuMemAlloc_v2") - before
print("RESULT " + json.dumps(out))
"""
PER_THREAD = 2  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
ASKS = {
    # cuBLAS-like: base names with the caller's CUDA version, legacy and per-thread streams
    ("cuMemAlloc", 12000, 0): [0, 0, "layer:cuMemAlloc_v2"],
    ("cuMemAlloc", 3000, 0): [0, 0, "layer:cuMemAlloc"],  # a caller built before CUDA 3.2: the 32-bit ABI
    ("cuCtxCreate", 12000, 0): [0, 0, "layer:cuCtxCreate_v3"],
    ("cuCtxCreate", 13000, 0): [500, 1, None],  # cuCtxCreate_v4 (12.5): the layer lacks it
    ("cuMemcpyAsync", 12080, 0): [0, 0, "layer:cuMemcpyAsync"],
    ("cuMemcpyAsync", 12080, PER_THREAD): [0, 0, "layer:cuMemcpyAsync_ptsz"],
    ("cuStreamBeginCapture", 12000, PER_THREAD): [0, 0, "layer:cuStreamBeginCapture_v2_ptsz"],
    ("cuStreamBeginCapture", 10000, 0): [0, 0, "layer:cuStreamBeginCapture"],
    # cuda.h 12 renames cuGraphInstantiate to cuGraphInstantiateWithFlags; the driver's look-up does not
    ("cuGraphInstantiate", 12000, 0): [0, 0, "layer:cuGraphInstantiate_v2"],
    ("cuGraphInstantiate", 11000, 0): [0, 0, "layer:cuGraphInstantiate_v2"],
    ("cuLaunchKernel", 12000, PER_THREAD): [0, 0, "layer:cuLaunchKernel_ptsz"],
    ("cuMemFree", 12000, 0): [0, 0, "layer:cuMemFree_v2"],
    ("cuTensorMapEncodeIm2colWide", 12000, 0): [500, 2, None],  # introduced in 12.8: version too old
    ("cuNoSuchEntryPoint", 12000, 0): [500, 1, None],
    # Triton-like: the entry points the overlay supplies
    ("cuGetProcAddress", 12000, 0): [0, 0, "overlay:cuGetProcAddress_v2"],
    ("cuLaunchKernelEx", 12000, 0): [0, 0, "overlay:cuLaunchKernelEx"],
    ("cuLaunchKernelEx", 12000, PER_THREAD): [0, 0, "overlay:cuLaunchKernelEx_ptsz"],
    ("cuTensorMapEncodeTiled", 12000, 0): [0, 0, "overlay:cuTensorMapEncodeTiled"],
}
NAMES = sorted({where.split(":")[1] for *_, where in ASKS.values() if where} | {"cuMemAlloc_v2"})


def test_versioned_entry_points_for_a_layer_without_cuGetProcAddress(pods, run_python) -> None:
    pod = pods("vcuda-no-gpa", **H100)
    env = {
        "LAYER": str(pod.lib_dir / "libcuda-control.so"),
        "ASKS": json.dumps(list(ASKS)),
        "NAMES": json.dumps(NAMES),
    }
    run = run_python(pod, LOOK_UPS, env)
    result = run.result
    assert {key: result[" ".join(map(str, key))] for key in ASKS} == ASKS
    assert result["metered"] == 1  # bound to the layer's own function: its counter moved
    assert run.last_record()["supplied"]["cuGetProcAddress_v2"] == "overlay"


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
    run = run_python(pods("vcuda", **H100), TORCH_FIRST)
    expected = {"platform": "NvmlCudaPlatform", "overlay_is_libcuda": True, "overlay_before_vllm": True}
    assert run.result == expected
    record = run.last_record()
    assert record["trigger"] == "import-hook (torch imported first)"
    assert record["libcuda"]["how"] == "LD_LIBRARY_PATH" and record["failed"] == []


def test_torch_first_on_a_complete_driver_leaves_the_guard_to_vllm(pods, run_python) -> None:
    code = "import json, sys, torch\nprint('RESULT ' + json.dumps('vllm_tmaguard.guard' in sys.modules))"
    assert run_python(pods("bare", **H100), code).result is False


@pytest.mark.parametrize(("kind", "needed"), [("vcuda", True), ("vcuda-no-gpa", True), ("bare", False)])
def test_torch_first_question_reads_the_files_only(pods, kind, needed) -> None:
    from vllm_tmaguard.early import guard_needed_before

    pod = pods(kind)
    assert guard_needed_before(pod.env) is needed
    assert guard_needed_before({**pod.env, "TMAGUARD_MODE": "off"}) is False
    assert str(pod.lib_dir) not in Path("/proc/self/maps").read_text()  # asking loaded nothing


def test_the_torch_first_question_asks_for_what_the_guard_supplies() -> None:
    """early.py keeps its own list (importing the decision would cost torch's import more): the same."""
    from vllm_tmaguard.decision import OVERLAY_GROUPS
    from vllm_tmaguard.early import SUPPLIED

    assert set(SUPPLIED) == {names[0] for names in OVERLAY_GROUPS.values()}
