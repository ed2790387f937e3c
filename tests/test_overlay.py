"""The overlay libcuda.so.1 on an emulated upstream-vCUDA pod: what CUDA runtime 12+ and Triton look up in
libcuda.so.1's own handle works with it and fails without it, and the layer keeps metering."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A cudart-like and a Triton-like consumer, after the guard ran (import vllm triggers it).
CONSUMERS = """
import ctypes, json, os
out = {}
if os.environ.get("PRELOAD_LIBCUDA"):
    ctypes.CDLL("libcuda.so.1")  # something loads libcuda.so.1 before vLLM (and the guard) does
import vllm
cuda = ctypes.CDLL("libcuda.so.1")  # the handle both consumers use
layer = ctypes.CDLL(os.environ["LAYER"], mode=os.RTLD_NOLOAD)
real = ctypes.CDLL(os.environ["REAL_DRIVER"], mode=os.RTLD_NOLOAD)
layer.standin_layer_calls.restype = real.standin_driver_calls.restype = ctypes.c_longlong
def calls(name):
    return [layer.standin_layer_calls(name.encode()), real.standin_driver_calls(name.encode())]
before = {n: calls(n) for n in ("cuMemAlloc_v2", "cuLaunchKernel", "cuLaunchKernelEx")}

# cudart: dlsym(dlopen("libcuda.so.1"), "cuGetProcAddress_v2"), then everything through it.
try:
    v2 = cuda.cuGetProcAddress_v2
    fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
    found = v2(b"cuMemAlloc", ctypes.byref(fn), 12000, 0, ctypes.byref(status))
    pointer = ctypes.c_uint64()
    alloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)(fn.value)
    out["cudart"] = [found, status.value, alloc(ctypes.byref(pointer), 1 << 20)]
    self_fn = ctypes.c_void_p()
    v2(b"cuGetProcAddress", ctypes.byref(self_fn), 12000, 0, ctypes.byref(status))
    out["v2_answers_itself"] = self_fn.value == ctypes.cast(v2, ctypes.c_void_p).value
except AttributeError as error:
    out["cudart"] = str(error)

# Triton: dlsym(dlopen("libcuda.so.1"), "cuLaunchKernelEx"), a plain launch and a cluster launch.
class Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]
class Config(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(Attr)), ("num_attrs", ctypes.c_uint)]
try:
    launch = cuda.cuLaunchKernelEx
    plain = Config((4, 1, 1), (128, 1, 1), 0, None, None, 0)
    cluster = Attr(4, b"", (ctypes.c_uint * 16)(2, 1, 1))
    clustered = Config((4, 1, 1), (128, 1, 1), 0, None, ctypes.pointer(cluster), 1)
    out["triton"] = [launch(ctypes.byref(plain), None, None, None),
                     launch(ctypes.byref(clustered), None, None, None)]
    counts = (ctypes.c_longlong * 3)()
    cuda.tmaguard_launch_counts(counts)
    out["launch_counts"] = list(counts)
except AttributeError as error:
    out["triton"] = str(error)
after = {n: calls(n) for n in before}
out["delta"] = {n: [a - b for a, b in zip(after[n], before[n])] for n in before}

# Never more than the layer lacks: every name the layer exports still resolves to the layer.
from vllm_tmaguard.elf import read_elf
exported = read_elf(os.environ["LAYER"], prefixes=(b"cu",)).defined
address = lambda lib, n: ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
out["shadowed"] = sorted(n for n in exported if address(cuda, n) != address(layer, n))
print("RESULT " + json.dumps(out))
"""


def consumers(run_python, pod, **env: str):
    return run_python(
        pod,
        CONSUMERS,
        {"LAYER": str(pod.lib_dir / "libcuda.so.1"), "REAL_DRIVER": str(pod.real_driver), **env},
    )


def test_cudart_and_triton_consumers_work_with_the_overlay_and_stay_metered(pods, run_python) -> None:
    run = consumers(run_python, pods("vcuda"))
    result = run.result
    assert result["cudart"] == [0, 0, 0] and result["v2_answers_itself"] is True
    assert result["triton"] == [0, 0]
    # The plain launch went through the layer's metered cuLaunchKernel; the cluster launch needs the Ex call
    # and was forwarded to the real driver, counted as unmetered.
    assert result["launch_counts"] == [1, 0, 1]
    assert result["delta"] == {"cuMemAlloc_v2": [1, 1], "cuLaunchKernel": [1, 1], "cuLaunchKernelEx": [0, 1]}
    assert result["shadowed"] == []
    record = run.last_record()
    assert record["supplied"] == dict.fromkeys(
        ["cuTensorMapEncodeTiled", "cuGetProcAddress_v2", "cuLaunchKernelEx"], "overlay"
    )
    assert record["unfixed"] == []


def test_consumers_fail_without_the_overlay(pods, run_python) -> None:
    result = consumers(run_python, pods("vcuda"), TMAGUARD_OVERLAY="off").result
    assert "undefined symbol: cuGetProcAddress_v2" in result["cudart"]
    assert "undefined symbol: cuLaunchKernelEx" in result["triton"]


def test_libcuda_loaded_first_falls_back_to_the_shims_and_says_how_to_fix(pods, run_python) -> None:
    run = consumers(run_python, pods("vcuda"), PRELOAD_LIBCUDA="1")
    assert "undefined symbol: cuGetProcAddress_v2" in run.result["cudart"]
    record = run.last_record()
    assert record["supplied"] == {"cuTensorMapEncodeTiled": "encoders", "cuGetProcAddress_v2": "proc-address"}
    assert len(record["unfixed"]) == 2
    assert all(
        "was already loaded when the guard ran" in u and "tmaguard env" in u for u in record["unfixed"]
    )


def test_read_only_runtime_directory_falls_back_to_memfd(pods, run_python) -> None:
    run = consumers(run_python, pods("vcuda"), TMAGUARD_RECORD_DIR="/proc/tmaguard-cannot-write-here")
    assert run.result["cudart"] == [0, 0, 0]
    (line,) = run.guard_lines()
    assert "overlay loaded (in memory)" in line


@pytest.mark.parametrize("kind", ["vcuda-fork", "bare"])
def test_no_overlay_where_the_layer_lacks_nothing(pods, run_python, kind: str) -> None:
    pod = pods(kind)
    run = run_python(
        pod,
        "import vllm, json; print('RESULT ' + json.dumps(open('/proc/self/maps').read().count('/overlay-')))",
    )
    assert run.result == 0 and run.last_record()["supplied"] == {}


def test_env_recipe_installs_an_overlay_that_works_without_the_guard(pods, run_python, tmp_path) -> None:
    pod = pods("vcuda")
    env = {**os.environ, **pod.env}
    from vllm_tmaguard.env_recipe import recipe
    from vllm_tmaguard.facts import probe

    facts = probe(env, pod.env["TMAGUARD_ROOT"], "test")
    printed, code = recipe(facts, env, None)
    assert code == 0 and "tmaguard env --install-dir /opt/tmaguard" in printed
    assert printed[-1] == f"export LD_LIBRARY_PATH=/opt/tmaguard:{pod.lib_dir}"

    install_dir = tmp_path / "tmaguard"
    printed, code = recipe(facts, env, str(install_dir))
    assert code == 0 and printed[-1] == f"export LD_LIBRARY_PATH={install_dir}:{pod.lib_dir}"
    manifest_env = {"LD_LIBRARY_PATH": f"{install_dir}:{pod.lib_dir}"}
    # The installed overlay alone (guard off) fixes cudart's and Triton's look-ups, still through the layer.
    result = consumers(run_python, pod, TMAGUARD_MODE="off", **manifest_env).result
    assert result["cudart"] == [0, 0, 0] and result["triton"] == [0, 0] and result["shadowed"] == []
    # With the guard on, it recognises its overlay and loads nothing more.
    run = consumers(run_python, pod, **manifest_env)
    record = run.last_record()
    assert record["libcuda"]["overlay_of"] == str(pod.lib_dir / "libcuda.so.1")
    assert record["supplied"] == {} and record["unfixed"] == []


def test_overlay_image_rejects_bad_layer_paths() -> None:
    from vllm_tmaguard.overlay import OverlayError, overlay_image

    for bad in ("relative/libcuda.so.1", "/" + "x" * 300):
        with pytest.raises(OverlayError):
            overlay_image(frozenset({"encoders"}), bad)


def test_every_overlay_variant_is_named_libcuda_and_needs_the_layer_once_written(tmp_path) -> None:
    """As shipped, a variant names the layer's placeholder in an optional DT_AUXILIARY entry (so the wheel
    needs no library outside the manylinux policy); the overlay written for a layer needs the layer's file."""
    from vllm_tmaguard.libraries import overlay_path
    from vllm_tmaguard.overlay import PLACEHOLDER, overlay_image

    groups = ["encoders", "proc-address", "launch-ex"]
    variants = [frozenset(g for i, g in enumerate(groups) if mask >> i & 1) for mask in range(1, 8)]
    layer = "/usr/local/nvidia/lib64/libcuda.so.1"
    for variant in variants:
        shipped = subprocess.run(
            ["readelf", "-d", overlay_path(variant)], capture_output=True, text=True, check=True
        ).stdout
        assert f"Auxiliary library: [{PLACEHOLDER.decode()}]" in shipped, shipped
        assert "Library soname: [libcuda.so.1]" in shipped and "Shared library: [/" not in shipped
        written = tmp_path / "libcuda.so.1"
        written.write_bytes(overlay_image(variant, layer))
        dynamic = subprocess.run(
            ["readelf", "-d", written], capture_output=True, text=True, check=True
        ).stdout
        assert f"Shared library: [{layer}]" in dynamic and "Auxiliary" not in dynamic, dynamic
        names = subprocess.run(
            ["nm", "-D", "--defined-only", overlay_path(variant)], capture_output=True, text=True, check=True
        ).stdout
        exported = {line.split()[-1] for line in names.splitlines() if " cu" in line}
        expected = {
            "encoders": {
                "cuTensorMapEncodeTiled",
                "cuTensorMapEncodeIm2col",
                "cuTensorMapEncodeIm2colWide",
                "cuTensorMapReplaceAddress",
            },
            "proc-address": {"cuGetProcAddress_v2"},
            "launch-ex": {"cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"},  # and its per-thread-stream twin
        }
        assert exported == set().union(*(expected[g] for g in variant)), (variant, exported)


def test_env_command_prints_the_recipe_and_installs(pods, tmp_path) -> None:
    pod = pods("vcuda")
    env = {**pod.environ(), "TMAGUARD_RECORD_DIR": str(tmp_path / "records")}
    tmaguard = [sys.executable, "-m", "vllm_tmaguard", "env"]
    printed = subprocess.run(tmaguard, env=env, capture_output=True, text=True, check=True).stdout
    assert "lacks cuTensorMapEncodeTiled, cuLaunchKernelEx, cuGetProcAddress_v2" in printed
    assert printed.rstrip().endswith(f"export LD_LIBRARY_PATH=/opt/tmaguard:{pod.lib_dir}")
    done = subprocess.run(
        [*tmaguard, "--install-dir", str(tmp_path / "o")], env=env, capture_output=True, text=True, check=True
    )
    assert (
        tmp_path / "o" / "libcuda.so.1"
    ).exists() and f"installed {tmp_path}/o/libcuda.so.1" in done.stdout
    bare = subprocess.run(
        tmaguard, env={**pods("bare").environ()}, capture_output=True, text=True, check=True
    )
    assert "exports every entry point the overlay would add: nothing to do" in bare.stdout
