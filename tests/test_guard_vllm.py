"""The guard with vLLM 0.32.0's real extension binaries and platform code, in fresh processes on emulated
pods (docs/design.md §6.1): vLLM's own NVML detection picks CUDA and imports vllm.platforms.cuda for real."""

from __future__ import annotations

import json

import pytest
from faultkit import GUARD_EFFECTS, NO_EFFECTS
from podkit import DEFAULT_DRIVER, expected_descriptor, write_gpus

from vllm_tmaguard.stages import ray_env

# The guard's activation as vLLM's import hook runs it, without the rest of vLLM's start-up: for a test about
# the guard's line or record alone (a vLLM start costs seconds of CPU; the tests about vLLM start it).
GUARD_ONLY = "from vllm_tmaguard.guard import activate\nactivate('import-hook')\n"
# Resolves vLLM's current platform (this imports the CUDA extension), then reports vLLM's ops.
RESOLVE_PLATFORM = """
import json
out = {}
try:
    from vllm.platforms import current_platform
    out["platform"] = type(current_platform).__name__
    import torch
    out["ops"] = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("_C::"))
except Exception as error:
    out["error"] = f"{type(error).__name__}: {error}"
print("RESULT " + json.dumps(out))
"""

# After the platform: the probe extension binds driver names like vLLM's extensions do; report where each
# call landed, by the stand-ins' own counters.
DRIVER_CALLS = (
    RESOLVE_PLATFORM.replace('print("RESULT "', "#")
    + """
import ctypes, os, sys
sys.path.insert(0, os.environ["DRIVER_CALLS_DIR"])
import driver_calls
layer = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
layer.standin_layer_calls.restype = ctypes.c_longlong
real = ctypes.CDLL(os.environ["REAL_DRIVER"], mode=os.RTLD_NOLOAD)
real.standin_driver_calls.restype = ctypes.c_longlong
names = ["cuMemAlloc_v2", "cuLaunchKernel", "cuPointerGetAttribute", "cuTensorMapEncodeTiled"]
def counts():
    return {n: [layer.standin_layer_calls(n.encode()), real.standin_driver_calls(n.encode())] for n in names}
out["init"] = driver_calls.init()
out["before"] = counts()
status, descriptor = driver_calls.encode_tiled(0x7F0000001000, 4096)
out["encode"] = [status, descriptor.hex()]
out["metered"] = driver_calls.metered_calls()
out["proc_address"] = driver_calls.alloc_through_proc_address()
out["after"] = counts()
# The overlay answers libcuda.so.1; with the shims, the encoder shim is in the global scope.
guard_lib = ctypes.CDLL("libcuda.so.1")
if not hasattr(guard_lib, "tmaguard_shim_source"):
    guard_lib = ctypes.CDLL(None)
out["encoder_source"] = guard_lib.tmaguard_shim_source(b"cuTensorMapEncodeTiled")
maps = open("/proc/self/maps").read().splitlines()
out["maps"] = sorted({l.split()[-1] for l in maps if ("tmaguard" in l or "/overlay-" in l) and ".so" in l})
print("RESULT " + json.dumps(out))
"""
)
UNDEFINED = "undefined symbol: cuTensorMapEncodeTiled"


def test_without_guard_vllm_fails_with_the_seed_error(off_reference) -> None:
    """vLLM's start on a vCUDA pod with the guard off, the run the suite shares (faultkit)."""
    _, run = off_reference("vcuda")
    assert run.outcome["error"].startswith("ImportError: ")
    assert run.outcome["error"].endswith("_C_stable_libtorch.abi3.so: " + UNDEFINED)
    assert run.guard_lines() == []


@pytest.mark.parametrize("overlay", ["auto", "off"])
def test_with_guard_vllm_starts_and_encoder_reaches_real_driver(pods, run_python, standins, overlay) -> None:
    pod = pods("vcuda")
    env = {
        "DRIVER_CALLS_DIR": str(standins["driver_calls_ext"].parent),
        "REAL_DRIVER": str(pod.real_driver),
        "TMAGUARD_OVERLAY": overlay,
    }
    run = run_python(pod, DRIVER_CALLS, env)
    result = run.result
    assert "error" not in result, result
    assert result["platform"] == "NvmlCudaPlatform"
    assert {"_C::machete_mm", "_C::awq_gemm"} <= set(result["ops"])

    status, descriptor = result["encode"]
    before, after = result["before"], result["after"]
    call = after["cuTensorMapEncodeTiled"][1]
    assert status == 0
    assert bytes.fromhex(descriptor) == expected_descriptor(7, 1, 0x7F0000001000, 4096, call)
    assert after["cuTensorMapEncodeTiled"][1] == before["cuTensorMapEncodeTiled"][1] + 1
    assert after["cuTensorMapEncodeTiled"][0] == -1  # the layer has no encoder: it never saw the call
    assert result["encoder_source"] == 3  # the real driver the layer loaded (csrc/tmaguard.h)
    if overlay == "auto":  # one overlay file standing in for libcuda.so.1
        (mapped,) = result["maps"]
        assert mapped.endswith("/libcuda.so.1") and "/overlay-" in mapped
    else:  # encoders + cuGetProcAddress_v2 shims, both missing from the layer
        assert [m.rsplit("/", 1)[1] for m in result["maps"]] == [
            "libtmaguard_encoders.so",
            "libtmaguard_proc_address.so",
        ]

    # Every other driver call still lands in the layer's metered entry points (and is forwarded by it).
    assert result["metered"] == [0, 0, 0]
    for name in ("cuLaunchKernel", "cuPointerGetAttribute"):
        assert after[name][0] == before[name][0] + 1 and after[name][1] == before[name][1] + 1
    # cuMemAlloc_v2: once directly, once as ("cuMemAlloc", 13000) through cuGetProcAddress_v2, which gives
    # the layer's metered cuMemAlloc_v2, never the legacy cuMemAlloc.
    assert result["proc_address"] == [0, 0, 0]
    assert after["cuMemAlloc_v2"][0] == before["cuMemAlloc_v2"][0] + 2

    (line,) = run.guard_lines()
    expected = "overlay loaded" if overlay == "auto" else "shims loaded (encoders, proc-address)"
    assert "tkestack vCUDA" in line and expected in line
    if overlay == "auto":
        assert "INFO" in line
    else:  # vLLM starts, but cudart's and Triton's handle-scoped look-ups stay broken, and the line says so
        assert "WARNING" in line
        assert "PROBLEM (2): TMAGUARD_OVERLAY=off, so the overlay cannot stand in" in line
        assert "fix: put the overlay first on LD_LIBRARY_PATH from the manifest: see `tmaguard env`" in line
        problem = run.last_record()["problems"][0]
        assert (problem["code"], problem["symbol"]) == ("handle-scoped-gap", "cuGetProcAddress_v2")


# Not the vCUDA fork: its look-ups hand out legacy ABIs, so the overlay answers them (test_layers_field.py).
@pytest.mark.parametrize("kind", ["bare", "hami"])
def test_complete_libcuda_loads_nothing_and_says_so(pods, run_python, kind: str) -> None:
    run = run_python(
        pods(kind), RESOLVE_PLATFORM + "\nprint(open('/proc/self/maps').read().count('tmaguard'))"
    )
    assert run.result["platform"] == "NvmlCudaPlatform"
    assert run.stdout.rstrip().endswith("\n0")  # no tmaguard library mapped
    (line,) = run.guard_lines()
    assert "INFO" in line and "has every entry point needed" in line
    record = run.last_record()
    assert record["outcome"] == "nothing-missing" and record["supplied"] == {} and record["actions"] == []
    expected_layer = {"bare": [], "hami": ["hami"]}[kind]
    assert [layer["name"] for layer in record["layers"]] == expected_layer


def test_no_gpu_is_silent_but_for_one_debug_line(pods, run_python) -> None:
    quiet = run_python(pods("nogpu"), RESOLVE_PLATFORM)
    assert quiet.guard_lines() == [] and quiet.stderr.count("tmaguard") == 0
    # The guard's own logger reads VLLM_LOGGING_LEVEL (issue.py): its line, the guard alone.
    debug = run_python(pods("nogpu"), GUARD_ONLY, {"VLLM_LOGGING_LEVEL": "DEBUG"}, records="debug")
    (line,) = debug.guard_lines()
    assert "DEBUG" in line and "no GPU" in line


def test_second_activation_in_the_same_process_is_a_no_op(pods, run_python) -> None:
    code = RESOLVE_PLATFORM + (
        "\nfrom vllm_tmaguard import plugin"
        "\nfirst = __import__('vllm_tmaguard.guard').guard.activate('test')"
        "\nassert plugin.platform_plugin() is None and plugin.general_plugin() is None"
        "\nassert __import__('vllm_tmaguard.guard').guard.activate('again') == first"
        "\nprint(open('/proc/self/maps').read().count('/overlay-'))"
    )
    run = run_python(pods("vcuda"), code)
    assert "platform" in run.result and len(run.guard_lines()) == 1
    assert int(run.stdout.split()[-1]) >= 1


def test_platform_plugin_entry_point_alone_fixes_the_import(pods, run_python) -> None:
    """With the .pth hook kept out (python -S semantics for it), vLLM's own plugin loader runs the guard."""
    code = "import vllm_tmaguard._import_hook as h; h.disarm()\n" + RESOLVE_PLATFORM
    run = run_python(pods("vcuda"), code)
    assert run.result["platform"] == "NvmlCudaPlatform"
    assert run.last_record()["trigger"] == "platform-plugin"


def test_validate_mode_reports_and_changes_nothing(off_reference, run_python) -> None:
    """The guard alone in validate mode changes nothing vLLM's start would meet, so vLLM fails as with the
    guard off (faultkit.GUARD_EFFECTS; the pod's reference run shows that failure)."""
    pod, off = off_reference("vcuda")
    run = run_python(pod, GUARD_EFFECTS, {"TMAGUARD_MODE": "validate"})
    assert off.outcome["error"].endswith(UNDEFINED)
    assert (run.returncode, run.result) == (0, NO_EFFECTS)
    (line,) = run.guard_lines()
    assert "lacks" in line and "would be supplied" in line and "overlay would be loaded" in line
    action = run.last_record()["actions"][0]
    assert (action["kind"], action["target"], action["applied"]) == ("load-overlay", "overlay", False)


def test_json_record(pods, run_python) -> None:
    """The line as JSON is the whole record (the guard's activation as vLLM's import hook runs it)."""
    run = run_python(pods("vcuda"), GUARD_ONLY, {"TMAGUARD_LOG_FORMAT": "json"})
    (line,) = run.guard_lines()
    record = json.loads(line.split("] ", 1)[1])
    assert record == run.last_record()
    assert record["missing"]["cuTensorMapEncodeTiled"] == [
        "vllm._C_stable_libtorch",
        "vllm._qutlass_C",
        "vllm.vllm_flash_attn._vllm_fa3_C",
    ]
    assert record["schema"] == 2 and record["outcome"] == "supplied"
    assert {"cuTensorMapEncodeTiled", "cuGetProcAddress_v2", "cuLaunchKernelEx"} <= set(record["supplied"])
    assert set(record["supplied"].values()) == {"overlay"}
    assert record["gpu"]["gpus"][0]["compute_capability"] == "8.9" and record["vllm"]["version"] == "0.32.0"
    assert record["libcuda"]["soname"] == "libcuda-control.so" and record["libcuda"]["real_driver"]


def _what_vllm_meets(record: dict) -> dict:
    """What a record's decisions change for vLLM's start: what was loaded or set, and the routing's knobs
    (the variables that carry toggles to Ray's workers aside: only Ray reads them)."""
    routing = record["routing"]
    return {
        "actions": [
            (a["kind"], a["target"], a["applied"])
            for a in record["actions"]
            if a["target"] not in ray_env.ENV_NAMES
        ],
        "env": {k: v for k, v in routing["env"].items() if k not in ray_env.ENV_NAMES},
        "blocked": routing["blocked_imports"],
    }


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("TMAGUARD_GEMM", "bogus", "auto | hopper | portable | latency"),
        ("TMAGUARD_LOG_FORMAT", "xml", "text | json"),
        ("TMAGUARD_MODE", "fix-it", "auto | validate | off"),
    ],
)
def test_a_bad_toggle_falls_back_to_its_default_and_keeps_the_symbol_fix(
    pods, run_python, variable: str, value: str, allowed: str
) -> None:
    """A typo in one setting used to switch the whole guard off (and vLLM died of the seed error). vLLM
    starts under the bad TMAGUARD_MODE; under the others the guard alone shows the decisions made with the
    setting unset, the same process for vLLM."""
    pod = pods("vcuda")
    starts_vllm = variable == "TMAGUARD_MODE"
    run = run_python(pod, RESOLVE_PLATFORM if starts_vllm else GUARD_ONLY, {variable: value})
    if starts_vllm:
        assert run.result["platform"] == "NvmlCudaPlatform"  # the overlay was loaded all the same
    else:
        unset = run_python(pod, GUARD_ONLY, records="unset").last_record()
        assert _what_vllm_meets(run.last_record()) == _what_vllm_meets(unset)
    (line,) = run.guard_lines()
    assert "WARNING" in line and "overlay loaded" in line
    assert f"PROBLEM: {variable}={value!r} is not valid; fix: set {variable} to {allowed}" in line
    problem = run.last_record()["problems"][0]
    assert problem["code"] == "toggle-invalid" and problem["subject"] == variable


def test_strict_mode_spelt_as_a_mode_gets_a_hint(pods, run_python) -> None:
    """The hint in the guard's line (vLLM starting with a bad toggle:
    test_a_bad_toggle_falls_back_to_its_default_and_keeps_the_symbol_fix)."""
    run = run_python(pods("vcuda"), GUARD_ONLY, {"TMAGUARD_MODE": "strict"})
    (line,) = run.guard_lines()
    assert "did you mean TMAGUARD_STRICT=1" in line and "overlay loaded" in line


def test_bad_toggle_in_strict_mode_stops_start_up(pods, run_python, tmp_path) -> None:
    pod = pods("vcuda")
    termination_log = tmp_path / "termination-log"  # the kubelet's file (terminationMessagePath)
    termination_log.write_text("")
    env = {"TMAGUARD_LOG_FORMAT": "xml", "TMAGUARD_STRICT": "1"}
    run = run_python(pod, RESOLVE_PLATFORM, env, termination_log=termination_log)
    assert run.returncode == 1 and "RESULT" not in run.stdout
    assert (
        "stopped start-up: TMAGUARD_LOG_FORMAT='xml' is not valid" in run.stderr
        and "text | json" in run.stderr
    )
    (message,) = termination_log.read_text().splitlines()  # what `kubectl describe pod` shows
    assert message.startswith("vllm-tmaguard (TMAGUARD_STRICT=1) stopped start-up: TMAGUARD_LOG_FORMAT='xml'")
    assert message in run.stderr


def test_unfixable_problem_warns_or_stops_in_strict_mode(pods, run_python) -> None:
    """A GPU but no libcuda.so.1 at all: nothing the guard can supply."""
    pod = pods("nogpu")
    write_gpus(pod.root, "NVIDIA H100 80GB HBM3", "550.142", 1)
    env = {"STANDIN_NVML_COUNT": "1"}
    lenient = run_python(pod, GUARD_ONLY, env)  # the line: the guard as vLLM's import hook runs it
    (line,) = lenient.guard_lines()
    assert "WARNING" in line and "PROBLEM: libcuda.so.1 not found" in line
    strict = run_python(pod, RESOLVE_PLATFORM, {**env, "TMAGUARD_STRICT": "1"})
    assert strict.returncode == 1
    assert "stopped start-up: libcuda.so.1 not found" in strict.stderr and "Fix:" in strict.stderr


def test_sm90_without_reachable_encoder_warns(pods, run_python) -> None:
    run = run_python(pods("lupine", gpu_name="NVIDIA H100 80GB HBM3", cc="9.0"), RESOLVE_PLATFORM)
    assert run.result["platform"] == "NvmlCudaPlatform"  # import fixed: the shim answers "not supported"
    record = run.last_record()
    assert record["tma"] == {
        "usable": False,
        "reason": "lupine: no local driver to forward cuTensorMapEncodeTiled to",
    }
    assert record["layers"][0]["name"] == "lupine"
    (line,) = run.guard_lines()
    assert "WARNING" in line and "kernels off" in line and "1 hint" in line  # routed where knobs exist
    assert record["routing"]["hints"][0].startswith("FP8 MoE")  # the rest is named, with the flag


def test_sm90_with_forwarded_encoder_has_usable_tma(pods, run_python) -> None:
    """The guard's TMA verdict in its record (vLLM's selectors keeping Machete and FA3 on this pod:
    test_routing.py's test_h100_with_forwarded_encoder_keeps_machete_and_fa3)."""
    run = run_python(pods("vcuda", gpu_name="NVIDIA H100 80GB HBM3", cc="9.0"), GUARD_ONLY)
    record = run.last_record()
    real = record["libcuda"]["real_driver"]
    assert real.endswith(f"/usr/local/nvidia/lib64/libcuda.so.{DEFAULT_DRIVER}")
    assert record["tma"] == {
        "usable": True,
        "reason": f"cuTensorMapEncodeTiled from the real driver the layer loads ({real})",
    }


def test_check_command_reports_what_a_vllm_process_would_do(pods) -> None:
    """`tmaguard check` runs the guard's decision without acting: files only, nothing of the layer's."""
    import subprocess
    import sys

    env = {**pods("vcuda").environ(), "TMAGUARD_MODE": "auto"}
    done = subprocess.run(
        [sys.executable, "-m", "vllm_tmaguard", "check", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    record = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert record["libcuda"]["how"] == "LD_LIBRARY_PATH" and record["mode"] == "auto"  # the pod's own mode
    assert record["actions"] and not any(action["applied"] for action in record["actions"])
    assert record["supplied"]["cuLaunchKernelEx"] == "overlay" and record["problems"] == []
    # With the guard off, what the guard would do is nothing (not what auto would supply).
    off = {**env, "TMAGUARD_MODE": "off"}
    for args in (["check"], ["check", "--json"]):
        command = [sys.executable, "-m", "vllm_tmaguard", *args]
        done = subprocess.run(command, env=off, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "supplied" not in done.stdout, done.stdout
        assert "TMAGUARD_MODE=off: the guard does nothing" in done.stdout
