"""Issue 26: the other sharing layers in the field, each on an emulated pod laid out as its device plugin lays
it out (tests/podkit.py FIELD_KINDS, and the vCUDA fork's pod), with the guard and the doctor as a vLLM pod
runs them: the layer named in the record, the log line, `tmaguard check` and the doctor; what the guard
decides there; what the layer meters (the record's `metering`); the problems and caveats with their fixes.

- the CUDA 12 vCUDA fork (coldzerofear/vcuda-controller ec4dee1): its cuGetProcAddress_v2 swaps in its
  legacy-ABI hooks by base name, so a cudart-style look-up's first allocation fails with
  CUDA_ERROR_INVALID_CONTEXT; the guard's overlay answers the look-ups and binds the layer's metered
  cuMemAlloc_v2.
- vgpu-manager: named from the pod's /etc/ld.so.preload; nothing loaded.
- nvshare: named from its preload; a missing scheduler socket is a problem before vLLM's first CUDA call;
  its CUDA-graph capture failure said with the vLLM flags that avoid it.
- KubeShare/Gemini: dead on this glibc; the doctor in a debug copy of the pod (the preload taken out) says
  so with the fix.
- lupine's client: named by its exports; the doctor true to the client at hand (TMA usable beside "only
  the tiled encoder", never "routed away")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import podkit
import pytest
from podkit import child_environ

GIB = 1 << 30
INVALID_CONTEXT, OUT_OF_MEMORY = 201, 2
GRAPHS_OFF = '--compilation-config \'{"cudagraph_mode": "NONE"}\''

# A cudart-like consumer: dlopen("libcuda.so.1"), cuGetProcAddress_v2 for base names with the CUDA version it
# was built for, then the calls. With IMPORT_VLLM=1 vLLM is imported first (the guard runs at that import);
# with IMPORT_VLLM=guard the guard alone runs first, as vLLM's import hook runs it (GUARD_ONLY): for a test
# about what the guard loaded and the layer then answers, not about vLLM.
CUDART = """
import ctypes, json, os
out = {}
if os.environ.get("IMPORT_VLLM") == "1":
    import vllm  # noqa: F401
elif os.environ.get("IMPORT_VLLM") == "guard":
    from vllm_tmaguard.guard import activate
    activate("import-hook")
cuda = ctypes.CDLL("libcuda.so.1")
v2 = cuda.cuGetProcAddress_v2
def look(name, version=13000, flags=0):
    fn, status = ctypes.c_void_p(), ctypes.c_int(-7)
    result = v2(name.encode(), ctypes.byref(fn), version, ctypes.c_uint64(flags), ctypes.byref(status))
    return result, status.value, fn.value
out["init"] = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint)(look("cuInit")[2])(0)
result, status, fn = look("cuMemAlloc")
alloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint64)(fn)
pointer = ctypes.c_uint64()
out["look_up"] = [result, status]
out["alloc"] = [alloc(ctypes.byref(pointer), 1 << 20), alloc(ctypes.byref(pointer), int(os.environ["PAST"]))]
fn = look("cuGetProcAddress", 12000)[2]  # cudart 12 asks for the look-up itself by its base name
gpa2 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                        ctypes.c_uint64, ctypes.POINTER(ctypes.c_int))(fn)
found, status = ctypes.c_void_p(), ctypes.c_int(-7)
out["look_up_itself"] = [gpa2(b"cuInit", ctypes.byref(found), 12000, 0, ctypes.byref(status)), status.value]
counter = os.environ.get("COUNTER")
if counter:
    lib, helper = counter.split(":")
    library = ctypes.CDLL(lib, mode=os.RTLD_NOLOAD)
    getattr(library, helper).restype = ctypes.c_longlong
    names = ("cuMemAlloc_v2", "cuMemAlloc", "cuGetProcAddress_v2")
    out["calls"] = {n: getattr(library, helper)(n.encode()) for n in names}
out["overlays"] = open("/proc/self/maps").read().count("/overlay-")
print("RESULT " + json.dumps(out))
"""


# The guard's activation as vLLM's import hook runs it (at `import vllm`), without the rest of vLLM's start:
# for the tests about the guard's record and line on a layer's pod, not about vLLM.
GUARD_ONLY = "from vllm_tmaguard.guard import activate\nactivate('import-hook')\n"


def cudart(run_python, pod: podkit.Pod, counter: str | None = None, **env: str):
    settings = {"PAST": str(30 * GIB), **({"COUNTER": counter} if counter else {}), **env}
    return run_python(pod, CUDART, settings)


def fork_counter(pod: podkit.Pod) -> str:
    return f"{pod.lib_dir / 'libcuda.so.1'}:standin_layer_calls"


def tmaguard(pod: podkit.Pod, records: Path, *args: str, env: dict[str, str] | None = None):
    """`python -m vllm_tmaguard ARGS` in a fresh process inside `pod`."""
    command = [sys.executable, "-m", "vllm_tmaguard", *args]
    environ = child_environ(pod, records, env, ("COLUMNS", "NO_COLOR", "FORCE_COLOR"))
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    podkit.guard_lines(done.stdout + "\n" + done.stderr)
    return done


def doctor(pod: podkit.Pod, records: Path, env: dict[str, str] | None = None) -> tuple[int, dict]:
    done = tmaguard(pod, records, "doctor", "--json", env=env)
    return done.returncode, json.loads(done.stdout)


def findings(report: dict, finding_id: str) -> list[dict]:
    return [f for f in report["findings"] if f["id"] == finding_id]


def metering(record: dict, layer: str) -> dict:
    return next(entry for entry in record["metering"] if entry["layer"] == layer)


# ---------------------------------------------------------------------------------------------------------
# The CUDA 12 vCUDA fork


def test_fork_without_the_guard_every_runtime_allocation_fails(pods, run_python) -> None:
    """Item 1: the fork's own look-up gives cudart its legacy cuMemAlloc hook: 201, as on the H100."""
    pod = pods("vcuda-fork", cc="9.0")
    result = cudart(run_python, pod, fork_counter(pod), TMAGUARD_MODE="off").result
    assert result["look_up"] == [0, 0] and result["alloc"][0] == INVALID_CONTEXT
    assert result["calls"]["cuMemAlloc"] == 2 and result["calls"]["cuMemAlloc_v2"] == 0
    assert result["look_up_itself"] == [0, -7]  # its v1 hook answers a 5-argument caller: status unset


def test_fork_with_the_guard_the_overlay_answers_its_look_ups(pods, run_python) -> None:
    """Item 1: the overlay maps ("cuMemAlloc", 13000) to cuMemAlloc_v2 and binds the layer's export of it:
    the allocation succeeds and stays metered (the quota refuses one past it); the layer's own look-up is
    never asked; the status is written."""
    pod = pods("vcuda-fork", cc="9.0")
    run = cudart(run_python, pod, fork_counter(pod), IMPORT_VLLM="guard")
    result = run.result
    assert result["overlays"] >= 1 and result["look_up"] == [0, 0]
    assert result["alloc"] == [0, OUT_OF_MEMORY]  # its 20 GiB quota
    assert result["calls"] == {"cuMemAlloc_v2": 2, "cuMemAlloc": 0, "cuGetProcAddress_v2": 0}
    assert result["look_up_itself"] == [0, 0]
    record = run.last_record()
    assert record["outcome"] == "supplied" and record["problems"] == []
    assert record["layers"][0]["name"] == "vcuda-fork" and record["lacking"] == []
    assert record["replaced"] == {"cuGetProcAddress": "overlay", "cuGetProcAddress_v2": "overlay"}
    assert record["tma"]["usable"] is True
    fork = metering(record, "vcuda-fork")
    assert fork["family"] == "ec4dee1" and fork["source"] == "coldzerofear/vcuda-controller ec4dee1"
    assert "cuMemCreate" in fork["rows"]["unmetered"] and "cuGraphLaunch" in fork["rows"]["unthrottled"]
    assert "cuMemAlloc_v2" in fork["rows"]["metered"]
    (line,) = run.guard_lines()
    assert "INFO" in line and "a vCUDA fork (CUDA 12): its look-ups hand out legacy ABIs" in line
    assert "the overlay answers them; overlay loaded" in line


def test_fork_check_and_doctor(pods, tmp_path) -> None:
    """Item 1: `tmaguard check` and the doctor say the same; the doctor lists what the fork does not meter."""
    pod = pods("vcuda-fork", cc="9.0")
    check = tmaguard(pod, tmp_path / "r", "check")
    assert "its look-ups hand out legacy ABIs; the overlay would answer them" in check.stdout
    assert "overlay would be loaded" in check.stdout
    code, report = doctor(pod, tmp_path / "r")
    assert code == 0 and report["layers"][0]["name"] == "vcuda-fork"
    assert findings(report, "lookups-replaced")[0]["severity"] == "ok"
    (meters,) = findings(report, "layer-metering")
    assert "coldzerofear/vcuda-controller ec4dee1" in meters["title"]
    assert "cuMemCreate, cuMemAllocAsync" in meters["detail"] and "NOT counted" in meters["detail"]
    assert "--enable-sleep-mode" in meters["fix"]["text"] and "NCCL_CUMEM_ENABLE=0" in meters["fix"]["text"]
    assert findings(report, "tma")[0]["severity"] == "ok"


def test_fork_where_the_overlay_cannot_stand_in_is_an_error(pods, run_python, tmp_path) -> None:
    """Items 1 and 4: with the overlay off, the fork's look-up stays broken: a problem with the fix in the
    record and the line, an error in the doctor, and no "TMA usable" beside it."""
    pod = pods("vcuda-fork", cc="9.0")
    run = cudart(run_python, pod, IMPORT_VLLM="guard", TMAGUARD_OVERLAY="off")
    assert run.result["alloc"][0] == INVALID_CONTEXT
    (problem,) = run.last_record()["problems"]
    assert problem["code"] == "lookup-swapped" and run.last_record()["outcome"] == "degraded"
    (line,) = run.guard_lines()
    assert "WARNING" in line and "PROBLEM: TMAGUARD_OVERLAY=off, so the overlay cannot stand in" in line
    code, report = doctor(pod, tmp_path / "r", {"TMAGUARD_OVERLAY": "off"})
    assert code == 1
    (error,) = findings(report, "lookup-swapped")
    assert error["severity"] == "error" and "CUDA_ERROR_INVALID_CONTEXT (201)" in error["detail"]
    assert "tmaguard env" in error["fix"]["text"]
    assert findings(report, "tma") == []


def test_fork_tmaguard_env_installs_a_working_overlay(pods, run_python, tmp_path) -> None:
    """Item 1: `tmaguard env --install-dir` (the preflight's) installs the overlay for the fork too, and the
    installed overlay alone (guard off) answers cudart's look-ups with the layer's metered export."""
    pod = pods("vcuda-fork", cc="9.0")
    done = tmaguard(pod, tmp_path / "r", "env", "--install-dir", str(tmp_path / "o"))
    assert done.returncode == 0
    assert "answers cuGetProcAddress, cuGetProcAddress_v2 with its legacy" in done.stdout
    library_path = f"{tmp_path / 'o'}:{pod.lib_dir}"
    run = cudart(run_python, pod, fork_counter(pod), TMAGUARD_MODE="off", LD_LIBRARY_PATH=library_path)
    assert run.result["alloc"] == [0, OUT_OF_MEMORY] and run.result["calls"]["cuMemAlloc"] == 0


def test_fork_torch_imported_first_still_gets_the_overlay(pods, run_python) -> None:
    """Item 1: torch maps libcuda.so.1 on import; the import hook runs the guard before that for the fork
    too (early.py), though the fork lacks none of the overlay's triggers."""
    run = run_python(pods("vcuda-fork", cc="9.0"), "import torch, vllm\nprint('RESULT 1')")
    record = run.last_record()
    assert record["trigger"] == "import-hook (torch imported first)"
    assert [a["kind"] for a in record["actions"]][:1] == ["load-overlay"] and record["problems"] == []


# ---------------------------------------------------------------------------------------------------------
# vgpu-manager


def test_vgpu_manager_named_from_the_pods_preload_file(pods, run_python, tmp_path) -> None:
    """Item 2: the /etc/ld.so.preload entry names it (with LD_PRELOAD out of the picture too); NVIDIA's
    libcuda.so.1 stays, so nothing is loaded; its metering is in the record."""
    pod = pods("vgpu-manager")
    run = run_python(pod, GUARD_ONLY)
    record = run.last_record()
    (layer,) = record["layers"]
    assert layer["name"] == "vgpu-manager" and layer["label"] == "vgpu-manager"
    assert "preloads /etc/vgpu-manager/driver/libvgpu-control.so" in layer["evidence"]
    assert "env CUDA_MEM_LIMIT_0" in layer["evidence"] and "env CUDA_CORE_LIMIT_0" in layer["evidence"]
    assert record["outcome"] == "nothing-missing" and record["actions"] == [] and record["problems"] == []
    meters = metering(record, "vgpu-manager")
    assert "cuMemCreate" in meters["rows"]["metered"] and "cuGraphLaunch" in meters["rows"]["throttled"]
    assert [c["code"] for c in meters["caveats"]] == ["core-limiter-timing"]
    (line,) = run.guard_lines()
    assert "INFO" in line and "tmaguard: vgpu-manager: libcuda.so.1 has every entry point needed" in line
    only_file = tmaguard(pod, tmp_path / "r", "check", "--json", env={"LD_PRELOAD": ""})
    assert json.loads(only_file.stdout)["layers"][0]["name"] == "vgpu-manager"
    oversold = tmaguard(pod, tmp_path / "r", "check", "--json", env={"CUDA_MEM_RATIO": "1.5"})
    codes = [c["code"] for c in metering(json.loads(oversold.stdout), "vgpu-manager")["caveats"]]
    assert codes == ["core-limiter-timing", "oversold-managed-memory"]


def test_vgpu_manager_keeps_its_quota_under_the_guard(pods, run_python, tmp_path) -> None:
    """Item 2: cudart's versioned look-up through NVIDIA's libcuda.so.1 lands on vgpu-manager's metered
    cuMemAlloc_v2 with the guard on; its 8 GiB refuses 30 GiB. The doctor: healthy, what it meters."""
    pod = pods("vgpu-manager")
    control = pod.root / podkit.VGPU_MANAGER_PRELOAD.lstrip("/")
    counter = f"{control.resolve()}:standin_vgpu_manager_calls"
    result = cudart(run_python, pod, counter, IMPORT_VLLM="guard").result
    assert result["alloc"] == [0, OUT_OF_MEMORY] and result["calls"]["cuMemAlloc_v2"] == 2
    assert result["overlays"] == 0
    code, report = doctor(pod, tmp_path / "r")
    assert code == 0 and report["layers"][0]["name"] == "vgpu-manager"
    (meters,) = findings(report, "layer-metering")
    assert "coldzerofear/vgpu-manager 3d7f66d" in meters["title"]
    assert findings(report, "caveat-core-limiter-timing")[0]["severity"] == "info"


# ---------------------------------------------------------------------------------------------------------
# nvshare


def test_nvshare_says_how_to_keep_vllm_out_of_cuda_graph_capture(pods, run_python, tmp_path) -> None:
    """Item 4: named from its preload; no quota and the launches that skip its lock in the record; the CUDA-
    graph capture failure in the line and the doctor with vLLM's flag (no environment variable does it)."""
    pod = pods("nvshare")
    run = run_python(pod, GUARD_ONLY)
    record = run.last_record()
    (layer,) = record["layers"]
    assert layer["name"] == "nvshare" and f"{podkit.NVSHARE_PRELOAD}" in layer["evidence"][0]
    assert "/var/run/nvshare/scheduler.sock is a socket" in layer["evidence"]
    assert record["problems"] == [] and record["actions"] == []
    meters = metering(record, "nvshare")
    assert meters["rows"]["managed"] == ["cuMemAlloc_v2"]
    assert {"cuLaunchKernelEx", "cuGraphLaunch"} <= set(meters["rows"]["unlocked"])
    graphs = next(c for c in meters["caveats"] if c["code"] == "cuda-graph-capture-fails")
    assert graphs["vllm_args"] == ["--compilation-config", '{"cudagraph_mode": "NONE"}']
    assert graphs["or_vllm_args"] == ["--enforce-eager"] and graphs["severity"] == "warning"
    assert "no-memory-quota" in [c["code"] for c in meters["caveats"]]
    (line,) = run.guard_lines()
    assert "WARNING" in line
    assert f"nvshare: CUDA-graph capture fails; pass {GRAPHS_OFF} (or --enforce-eager)" in line
    code, report = doctor(pod, tmp_path / "r")
    assert code == 1
    (caveat,) = findings(report, "caveat-cuda-graph-capture-fails")
    assert caveat["severity"] == "warning" and caveat["fix"]["vllm_args"] == graphs["vllm_args"]
    assert "--enforce-eager" in caveat["fix"]["text"]
    assert report["fix"]["vllm_args"] == graphs["vllm_args"]
    assert findings(report, "caveat-no-memory-quota")[0]["severity"] == "info"


def test_nvshare_missing_socket_is_said_before_vllm_hangs(pods, run_python, tmp_path) -> None:
    """Item 4: with no scheduler socket the guard's line names the fix before the process's first CUDA call
    (which then dies in nvshare's client thread); strict mode stops before any CUDA call; the doctor: an
    error with the fix, never "TMA usable"."""
    pod = podkit.build_pod(tmp_path / "pod", "nvshare", cc="9.0", scheduler_socket=False)
    code = GUARD_ONLY + "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\nprint('RESULT 1')"
    run = run_python(pod, code, timeout=30)
    assert run.returncode == 1 and "RESULT" not in run.stdout
    (line,) = run.guard_lines()
    assert "PROBLEM: no nvshare scheduler socket at /var/run/nvshare/scheduler.sock" in line
    assert "fix: start nvshare-scheduler on the node and mount /var/run/nvshare into the pod" in line
    assert "[NVSHARE][FATAL]" in run.stderr  # after the line: the guard ran before CUDA
    record = run.last_record()
    assert record["problems"][0]["code"] == "layer-daemon-missing" and record["outcome"] == "degraded"
    strict = run_python(pod, code, {"TMAGUARD_STRICT": "1"}, timeout=30, records="strict")
    assert strict.returncode != 0 and "[NVSHARE]" not in strict.stderr
    assert "stopped start-up: no nvshare scheduler socket" in strict.stderr
    status, report = doctor(pod, tmp_path / "r")
    assert status == 1
    (error,) = findings(report, "layer-daemon-missing")
    assert error["severity"] == "error" and "nvshare-scheduler" in error["fix"]["text"]
    assert findings(report, "tma") == []


# ---------------------------------------------------------------------------------------------------------
# KubeShare/Gemini


def test_kubeshare_doctor_in_a_debug_copy_says_the_hook_cannot_load(pods, tmp_path) -> None:
    """Item 6: preloaded, the hook kills every process on this glibc, the doctor's too (shown in a process
    of its own); in the debug copy (preload taken out, docs/operator.md) the doctor names it from its
    mounted hook and variables: an error with the fix."""
    pod = pods("kubeshare")
    hook = pod.root / podkit.KUBESHARE_HOOK.lstrip("/")
    preloaded = subprocess.run(
        [sys.executable, "-m", "vllm_tmaguard", "doctor"],
        env=child_environ(pod, tmp_path / "r", {"LD_PRELOAD": str(hook)}),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert preloaded.returncode == 127 and "undefined symbol: __libc_dlopen_mode" in preloaded.stderr
    code, report = doctor(pod, tmp_path / "r")
    assert code == 1
    (layer,) = report["layers"]
    assert layer["name"] == "kubeshare" and "env POD_MANAGER_PORT" in layer["evidence"]
    assert f"{podkit.KUBESHARE_HOOK} is mounted (KubeShare's hook)" in layer["evidence"]
    (error,) = findings(report, "layer-cannot-load")
    assert error["severity"] == "error" and "gone in glibc 2.34+" in error["title"]
    assert "glibc < 2.34" in error["fix"]["text"] and "whole GPU" in error["fix"]["text"]
    assert findings(report, "caveat-meters-nothing-cuda12")[0]["severity"] == "warning"
    check = tmaguard(pod, tmp_path / "r", "check")
    assert "KubeShare/Gemini" in check.stdout and "PROBLEM: KubeShare's hook" in check.stdout


# ---------------------------------------------------------------------------------------------------------
# lupine


def test_lupine_client_named_by_its_exports_and_the_doctor_true_to_it(pods, tmp_path) -> None:
    """Items 4 and 5: lupine's client is named by what it exports (the variable unset too); it forwards the
    tiled encoder, so TMA is usable, and the doctor says that and only that: no "routed away" beside "TMA
    usable"; the other encoders' NOT_SUPPORTED and the cuBLAS failure are said."""
    pod = pods("lupine-client", cc="9.0")
    unset = {"LUPINE_SERVER": ""}
    check = json.loads(tmaguard(pod, tmp_path / "r", "check", "--json", env=unset).stdout)
    (layer,) = check["layers"]
    assert layer["evidence"] == ["libcuda.so.1 exports lupine_checkpoint_drain_cuda_calls"]
    assert layer["name"] == "lupine" and all(a["kind"] != "load-overlay" for a in check["actions"])
    forwarded = "lupine forwards cuTensorMapEncodeTiled to its server (a round trip per encode)"
    assert check["tma"] == {"usable": True, "reason": forwarded}
    code, report = doctor(pod, tmp_path / "r")
    ids = {f["id"]: f["severity"] for f in report["findings"]}
    assert ids["tma"] == "ok" and "known-lupine-no-local-driver" not in ids
    assert ids["caveat-encoders-tiled-only"] == "info" and ids["caveat-round-trips"] == "info"
    assert ids["caveat-half-cublas-fails"] == "warning" and code == 1
    said = [f["title"] + f["detail"] for f in report["findings"]]
    assert not [text for text in said if "routes vLLM's TMA kernels away" in text or "routed away" in text]


def test_lupine_without_the_encoder_is_routed_away_and_never_called_usable(pods, tmp_path) -> None:
    """Item 4: a client without the tiled encoder (the older stand-in): TMA unusable and routed away."""
    _, report = doctor(pods("lupine", cc="9.0"), tmp_path / "r")
    ids = [f["id"] for f in report["findings"]]
    assert "known-lupine-no-local-driver" in ids
    (tma,) = findings(report, "tma")
    assert tma["severity"] == "info" and "routes vLLM's TMA kernels away" in tma["title"]


# ---------------------------------------------------------------------------------------------------------
# The verdict cache watches what the new fingerprints read


@pytest.mark.parametrize("kind", ["vgpu-manager", "nvshare", "kubeshare", "lupine-client"])
def test_every_input_of_the_field_layers_full_run_is_watched(pods, run_python, kind: str) -> None:
    """The preloaded files' ELF tables, the socket's stat, the libc read for KubeShare's hook: each is an
    input of the stored verdict (as tests/test_verdict_inputs.py checks for the seed's kinds)."""
    from test_verdict_inputs import RECORDING_RUN, exempt

    from vllm_tmaguard.process import find_package_dir

    run = run_python(pods(kind, cc="9.0"), RECORDING_RUN)
    (entry,) = json.loads((run.record_dir / "verdicts.json").read_text())["entries"]
    watched = {path for _, path, _ in entry["files"]}
    vllm_dir, sys_path = Path(find_package_dir("vllm")), run.result["sys_path"]
    inputs = {
        path
        for op, path in run.result["touched"]
        if not exempt(path, run.record_dir.resolve(), vllm_dir, sys_path)
    }
    assert sorted(inputs - watched) == []
    preload = {
        "vgpu-manager": "libvgpu-control.so", "nvshare": "libnvshare.so", "kubeshare": "libgemhook.so.1",
    }  # fmt: skip
    if kind in preload:
        assert any(path.endswith(preload[kind]) for path in watched)
    if kind == "nvshare":
        assert any(path.endswith(podkit.NVSHARE_SOCKET) for path in watched)
