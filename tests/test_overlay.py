"""The overlay libcuda.so.1 in front of the emulated tkestack vCUDA builds (tests/csrc/standin_layer.c models
master and v1.0.5 as built from their source: hooks by requested name, exports through a table only the
layer's init fills, NVML being the layer), looked up the way the CUDA runtime, cuBLASLt and Triton look
entry points up (docs/design.md §2.2-§2.6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from faultkit import default_record_dir_at

VCUDA = ["vcuda", "vcuda-v105"]
GIB = 1 << 30

# A cudart-like consumer: dlopen("libcuda.so.1"), cuGetProcAddress_v2 for base names with the CUDA version it
# was built for and the per-thread-stream flag, then the calls; a cuBLASLt-like raw table by dlsym on the same
# handle; a Triton-like cuLaunchKernelEx.
CONSUMERS = """
import ctypes, json, os
out = {}
if os.environ.get("PRELOAD_LIBCUDA"):
    ctypes.CDLL("libcuda.so.1")  # something loads libcuda.so.1 before vLLM (and the guard) does
if os.environ.get("IMPORT_VLLM", "1") == "1":
    import vllm
elif os.environ["IMPORT_VLLM"] == "guard":  # the guard alone, as vLLM's import hook runs it
    from vllm_tmaguard.guard import activate
    activate("import-hook")
cuda = ctypes.CDLL("libcuda.so.1")
c_size = ctypes.c_uint64
try:
    v2 = cuda.cuGetProcAddress_v2
except AttributeError as error:
    print("RESULT " + json.dumps({"cudart": str(error)}))
    raise SystemExit
def look(name, flags=0, version=13000):
    fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
    result = v2(name.encode(), ctypes.byref(fn), version, ctypes.c_uint64(flags), ctypes.byref(status))
    return result, status.value, fn.value
# cudart asks for its private export tables before cuInit: the layer's table is still empty then.
table = ctypes.c_void_p()
export_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
export = export_type(look("cuGetExportTable")[2])
out["export_table_before_init"] = export(ctypes.byref(table), None)
out["init"] = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint)(look("cuInit")[2])(0)
alloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(c_size), c_size)(look("cuMemAlloc")[2])
pointer = c_size()
out["alloc_1_mib"] = alloc(ctypes.byref(pointer), 1 << 20)
out["alloc_past_quota"] = alloc(ctypes.byref(pointer), int(os.environ["PAST_QUOTA"]))
info = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(c_size), ctypes.POINTER(c_size))(look("cuMemGetInfo")[2])
free, total = c_size(), c_size()
out["mem_get_info"] = [info(ctypes.byref(free), ctypes.byref(total)), free.value, total.value]
launch = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3)
per_thread = launch(look("cuLaunchKernel", flags=2)[2])
out["launch_per_thread"] = per_thread(None, 1, 1, 1, 1, 1, 1, 0, None, None, None)
newer = ("cuLibraryLoadData", "cuKernelGetFunction", "cuCtxCreate")
out["newer_than_the_layer"] = {n: look(n)[:2] for n in newer}
raw = ("cuLibraryLoadData", "cuStreamWaitValue32", "cuCtxCreate_v4")
out["raw_table"] = {n: hasattr(cuda, n) for n in raw}
# Triton: cuLaunchKernelEx from the same handle, a plain launch and a cluster launch.
class Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]
class Config(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(Attr)), ("num_attrs", ctypes.c_uint)]
plain = Config((4, 1, 1), (128, 1, 1), 0, None, None, 0)
cluster = Attr(4, b"", (ctypes.c_uint * 16)(2, 1, 1))
clustered = Config((4, 1, 1), (128, 1, 1), 0, None, ctypes.pointer(cluster), 1)
out["triton"] = [cuda.cuLaunchKernelEx(ctypes.byref(plain), None, None, None),
                 cuda.cuLaunchKernelEx(ctypes.byref(clustered), None, None, None)]
counts = (ctypes.c_longlong * 3)()
cuda.tmaguard_launch_counts(counts)
out["launch_counts"] = list(counts)
layer = ctypes.CDLL(os.environ["LAYER"], mode=os.RTLD_NOLOAD)
layer.standin_layer_calls.restype = layer.standin_layer_used_bytes.restype = ctypes.c_longlong
out["layer_calls"] = {
    n: layer.standin_layer_calls(n.encode())
    for n in ("cuMemAlloc_v2", "cuMemAlloc", "cuMemGetInfo_v2", "cuLaunchKernel_ptsz", "cuLaunchKernel")
}
out["layer_used"] = layer.standin_layer_used_bytes()
real = ctypes.CDLL(os.environ["REAL_DRIVER"], mode=os.RTLD_NOLOAD)
real.standin_driver_calls.restype = ctypes.c_longlong
out["real_calls"] = {n: real.standin_driver_calls(n.encode()) for n in ("cuLibraryLoadData", "cuMemAlloc")}
print("RESULT " + json.dumps(out))
"""


def consumers(run_python, pod, prefix: tuple[str, ...] = (), **env: str):
    """CONSUMERS in a fresh process of `pod`; IMPORT_VLLM: "1" (vLLM imported first, its import hook running
    the guard), "guard" (the guard alone: for a test about what the guard loaded and the driver's
    consumers then get, not about vLLM), "0" (neither)."""
    settings = {
        "LAYER": str(pod.lib_dir / "libcuda.so.1"),
        "REAL_DRIVER": str(pod.real_driver),
        "PAST_QUOTA": str(30 * GIB),
        **env,
    }
    return run_python(pod, CONSUMERS, settings, prefix=prefix)


@pytest.mark.parametrize("kind", VCUDA)
def test_cudart_lookups_get_the_layers_metered_exact_symbols_and_its_quota(pods, run_python, kind) -> None:
    run = consumers(run_python, pods(kind, cc="9.0"))
    result = run.result
    # The layer's table is still empty before its init: the call reached the real driver's answer (the
    # stand-in driver has no private tables: not found), not a call through NULL.
    assert result["export_table_before_init"] == 500 and result["init"] == 0
    # ("cuMemAlloc", 13000): the layer's metered cuMemAlloc_v2, never its legacy cuMemAlloc hook (which calls
    # the driver's pre-3.2 ABI: CUDA_ERROR_INVALID_CONTEXT under vCUDA master's own look-up).
    assert result["alloc_1_mib"] == 0 and result["alloc_past_quota"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert result["layer_calls"]["cuMemAlloc_v2"] == 2 and result["layer_calls"]["cuMemAlloc"] == 0
    assert result["real_calls"]["cuMemAlloc"] == 0
    assert result["mem_get_info"] == [0, 20 * GIB - (1 << 20), 20 * GIB]  # the quota, as the layer shows it
    assert result["layer_used"] == 1 << 20  # the layer's own accounting has the process
    # A per-thread-default-stream caller gets the layer's cuLaunchKernel_ptsz.
    assert result["launch_per_thread"] == 0 and result["layer_calls"]["cuLaunchKernel_ptsz"] == 1
    # What the layer (CUDA 11 headers) lacks comes from the real driver it loaded, for look-ups and dlsym.
    assert result["newer_than_the_layer"] == {n: [0, 0] for n in result["newer_than_the_layer"]}
    assert result["raw_table"] == dict.fromkeys(result["raw_table"], True)
    # Triton's plain launch goes through the layer's metered cuLaunchKernel; the cluster launch needs the
    # Ex call and is forwarded to the real driver, counted as unmetered.
    assert result["triton"] == [0, 0] and result["launch_counts"] == [1, 0, 1]
    assert result["layer_calls"]["cuLaunchKernel"] == 1
    record = run.last_record()
    assert record["outcome"] == "supplied" and record["problems"] == []
    assert record["layers"][0]["name"] == "vcuda" and record["tma"]["usable"] is True


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # master's v1 look-up swaps in its hook by the requested name: the legacy one for "cuMemAlloc".
        ("vcuda", "201"),
        # v1.0.5's v1 look-up forwards through the table its init has not filled yet.
        ("vcuda-v105", "empty table"),
    ],
)
def test_the_layers_own_lookup_fails_as_the_real_layer_does(pods, kind, expected, tmp_path) -> None:
    """Why the overlay never asks the layer's look-ups (the stand-ins reproduce the measured failures)."""
    pod = pods(kind, cc="9.0")
    code = (
        "import ctypes\n"
        "cuda = ctypes.CDLL('libcuda.so.1')\n"
        "fn = ctypes.c_void_p()\n"
        "cuda.cuGetProcAddress(b'cuMemAlloc', ctypes.byref(fn), 13000, ctypes.c_uint64(0))\n"
        "alloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint64)(fn.value)\n"
        "print(alloc(ctypes.byref(ctypes.c_uint64()), 4096))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**pod.environ(), "TMAGUARD_MODE": "off"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert expected in done.stdout + done.stderr


@pytest.mark.parametrize("kind", VCUDA)
def test_without_the_overlay_the_runtimes_lookup_is_missing(pods, run_python, kind) -> None:
    result = consumers(run_python, pods(kind), TMAGUARD_OVERLAY="off", IMPORT_VLLM="guard").result
    assert "undefined symbol: cuGetProcAddress_v2" in result["cudart"]


# The guard as a vLLM process runs it, without vLLM or torch (both touch the driver at import).
GUARD_ALONE = (
    "from vllm_tmaguard.guard import activate\nprint('RESULT ' + str(len(activate('test')['actions'])))"
)


def test_the_guard_initialises_no_layer(pods, run_python) -> None:
    """In a vCUDA pod libnvidia-ml.so.1 is the layer: an in-process nvmlInit would run its init (its config,
    a registration with the node's daemon) and, without its config, exit the process."""
    pod = pods("vcuda", cc="9.0")
    run = run_python(pod, GUARD_ALONE)
    assert run.result == 1 and "overlay loaded" in run.guard_lines()[0]
    check = subprocess.run(
        [sys.executable, "-m", "vllm_tmaguard", "check"],
        env=pod.environ(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "tkestack vCUDA" in check.stdout
    assert not (pod.root / "etc/vcuda/registrations").exists()
    run = run_python(pods("vcuda", cc="9.0", vcuda_config=False), GUARD_ALONE)
    assert run.returncode == 0 and run.result == 1  # the layer's exit(-1) never ran


def test_hamis_process_wide_dlsym_is_not_touched_by_the_guard(pods, run_python) -> None:
    pod = pods("hami", cc="9.0")
    run = run_python(pod, GUARD_ALONE)
    assert run.result == 0 and "HAMi-core: libcuda.so.1 has every entry point needed" in run.guard_lines()[0]
    assert not (pod.root / "tmp/vgpu-state").exists()  # its dlsym never initialised its shared state


def test_libcuda_loaded_first_falls_back_to_the_shims_and_says_how_to_fix(pods, run_python) -> None:
    run = consumers(run_python, pods("vcuda"), PRELOAD_LIBCUDA="1", IMPORT_VLLM="guard")
    assert "undefined symbol: cuGetProcAddress_v2" in run.result["cudart"]
    record = run.last_record()
    assert record["supplied"] == {"cuTensorMapEncodeTiled": "encoders", "cuGetProcAddress_v2": "proc-address"}
    gaps = [p for p in record["problems"] if p["code"] == "handle-scoped-gap"]
    assert {p["symbol"] for p in gaps} == {"cuGetProcAddress_v2", "cuLaunchKernelEx"}
    assert all(
        "was already loaded when the guard ran" in p["cause"] and "tmaguard env" in p["fix"] for p in gaps
    )


def test_a_refused_record_directory_is_said_and_the_default_one_used(pods, run_python, tmp_path) -> None:
    default = tmp_path / "default-records"  # the process's /tmp/tmaguard-<uid>
    default.mkdir(mode=0o700)
    prefix = default_record_dir_at(default)
    run = consumers(
        run_python,
        pods("vcuda"),
        prefix,
        TMAGUARD_RECORD_DIR="/proc/tmaguard-cannot-write-here",
        IMPORT_VLLM="guard",
    )
    assert run.result["init"] == 0
    (line,) = run.guard_lines()
    assert "overlay loaded;" in line and "WARNING" in line
    assert "PROBLEM: TMAGUARD_RECORD_DIR is refused: cannot create /proc/tmaguard-cannot-write-here" in line
    assert "fix: point TMAGUARD_RECORD_DIR at a directory only this user can enter (0700)" in line
    record = json.loads((default / "last.json").read_text())
    assert record["problems"][0]["code"] == "record-dir-refused"
    assert record["record_file"] == f"/tmp/tmaguard-{os.getuid()}/process-{record['pid']}.json"


def test_without_any_private_directory_the_overlay_stays_in_memory(pods) -> None:
    from vllm_tmaguard.stages import overlay

    path = overlay.install(str(pods("vcuda").lib_dir / "libcuda.so.1"), None)
    assert path.startswith("/proc/self/fd/") and Path(path).read_bytes()[:4] == b"\x7fELF"


# Not the vCUDA fork, which lacks nothing either: its own cuGetProcAddress_v2 hands out legacy ABIs, so the
# overlay answers its look-ups (tests/test_layers_field.py).
@pytest.mark.parametrize("kind", ["bare"])
def test_no_overlay_where_the_layer_lacks_nothing(pods, run_python, kind: str) -> None:
    run = run_python(
        pods(kind),
        "from vllm_tmaguard.guard import activate\nactivate('import-hook')\nimport json\n"  # the guard alone
        "print('RESULT ' + json.dumps(open('/proc/self/maps').read().count('/overlay-')))",
    )
    assert run.result == 0 and run.last_record()["supplied"] == {}


def test_env_recipe_installs_an_overlay_that_works_without_the_guard(pods, run_python, tmp_path) -> None:
    pod = pods("vcuda", cc="9.0")
    env = {**os.environ, **pod.env}
    from vllm_tmaguard.install.env_recipe import recipe
    from vllm_tmaguard.stages.facts import probe

    facts = probe(env, pod.env["TMAGUARD_ROOT"], "test", eager=None)
    printed, code = recipe(facts, env, None)
    assert code == 0 and "tmaguard env --install-dir /opt/tmaguard" in printed
    assert not any("an init container sharing" in line for line in printed)  # it cannot see the layer
    assert printed[-1] == f"export LD_LIBRARY_PATH=/opt/tmaguard:{pod.lib_dir}"
    # Run again where the overlay directory is already first: not doubled.
    printed, _ = recipe(facts, {**env, "LD_LIBRARY_PATH": f"/opt/tmaguard:{pod.lib_dir}"}, None)
    assert printed[-1] == f"export LD_LIBRARY_PATH=/opt/tmaguard:{pod.lib_dir}"

    install_dir = tmp_path / "tmaguard"
    printed, code = recipe(facts, env, str(install_dir))
    assert code == 0 and printed[-1] == f"export LD_LIBRARY_PATH={install_dir}:{pod.lib_dir}"
    manifest_env = {"LD_LIBRARY_PATH": f"{install_dir}:{pod.lib_dir}"}
    # The installed overlay alone (guard off) serves the runtime's and Triton's look-ups, through the layer.
    result = consumers(run_python, pod, TMAGUARD_MODE="off", IMPORT_VLLM="0", **manifest_env).result
    assert result["alloc_past_quota"] == 2 and result["triton"] == [0, 0]
    # With the guard on, it recognises its overlay, names the layer behind it, and loads nothing more.
    run = consumers(run_python, pod, IMPORT_VLLM="guard", **manifest_env)
    record = run.last_record()
    assert record["libcuda"]["overlay_of"] == str(pod.lib_dir / "libcuda.so.1")
    assert record["supplied"] == {} and record["problems"] == []
    assert [layer["name"] for layer in record["layers"]] == ["vcuda"]  # not a "vCUDA fork"
    assert "tkestack vCUDA behind tmaguard's overlay" in run.guard_lines()[0]


def test_overlay_image_rejects_bad_layer_paths() -> None:
    from vllm_tmaguard.stages.overlay import OverlayError, overlay_image

    for bad in ("relative/libcuda.so.1", "/" + "x" * 300):
        with pytest.raises(OverlayError):
            overlay_image(bad)


def test_the_overlay_is_named_libcuda_carries_every_driver_symbol_and_needs_the_layer_once_written(
    tmp_path,
) -> None:
    """As shipped, the overlay names the layer's placeholder in an optional DT_AUXILIARY entry (so the wheel
    needs no library outside the manylinux policy); the overlay written for a layer needs the layer's file."""
    from vllm_tmaguard.stages.catalogue import overlay_path
    from vllm_tmaguard.stages.overlay import PLACEHOLDER, overlay_image

    layer = "/usr/local/nvidia/lib64/libcuda.so.1"
    shipped = subprocess.run(
        ["readelf", "-d", overlay_path()], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert f"Auxiliary library: [{PLACEHOLDER.decode()}]" in shipped, shipped
    assert "Library soname: [libcuda.so.1]" in shipped and "Shared library: [/" not in shipped
    written = tmp_path / "libcuda.so.1"
    written.write_bytes(overlay_image(layer))
    dynamic = subprocess.run(
        ["readelf", "-d", written], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert f"Shared library: [{layer}]" in dynamic and "Auxiliary" not in dynamic, dynamic
    names = subprocess.run(
        ["nm", "-D", "--defined-only", overlay_path()],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    exported = {line.split()[-1] for line in names.splitlines() if " cu" in line}
    import vllm_tmaguard

    catalogue = Path(vllm_tmaguard.__file__).parent / "csrc" / "driver_symbols.h"
    listed = {
        line.split(", ")[1].split(")")[0] for line in catalogue.read_text().splitlines() if "    X(" in line
    }
    assert exported == listed and len(listed) > 600
    assert {
        "cuTensorMapEncodeTiled",
        "cuGetProcAddress_v2",
        "cuLaunchKernelEx",
        "cuLibraryLoadData",
    } <= exported


def test_env_command_prints_the_recipe_and_installs(pods, tmp_path) -> None:
    pod = pods("vcuda")
    env = {**pod.environ(), "TMAGUARD_RECORD_DIR": str(tmp_path / "records")}
    tmaguard = [sys.executable, "-m", "vllm_tmaguard", "env"]
    printed = subprocess.run(
        tmaguard, env=env, capture_output=True, text=True, check=True, timeout=300
    ).stdout
    assert "lacks cuTensorMapEncodeTiled, cuGetProcAddress_v2, cuLaunchKernelEx" in printed
    assert printed.rstrip().endswith(f"export LD_LIBRARY_PATH=/opt/tmaguard:{pod.lib_dir}")
    done = subprocess.run(
        [*tmaguard, "--install-dir", str(tmp_path / "o")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert (
        tmp_path / "o" / "libcuda.so.1"
    ).exists() and f"installed {tmp_path}/o/libcuda.so.1" in done.stdout
    bare = subprocess.run(
        tmaguard, env={**pods("bare").environ()}, capture_output=True, text=True, check=True, timeout=300
    )
    assert "exports every entry point the overlay would add: nothing to do" in bare.stdout


def test_env_command_installs_the_overlay_whatever_a_routing_toggle_says(pods, tmp_path) -> None:
    """The preflight runs `tmaguard env --install-dir`: a typo in TMAGUARD_GEMM must not keep the overlay
    out."""
    env = {**pods("vcuda").environ(), "TMAGUARD_RECORD_DIR": str(tmp_path / "r"), "TMAGUARD_GEMM": "fast"}
    command = [sys.executable, "-m", "vllm_tmaguard", "env", "--install-dir", str(tmp_path / "o")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and (tmp_path / "o" / "libcuda.so.1").exists(), done.stderr
    warning = "warning: TMAGUARD_GEMM='fast' is not valid; TMAGUARD_GEMM falls back to its default, auto"
    assert warning in done.stderr
