"""What vLLM is started with that the layer cannot take (issue 32, items 1 and 2), in real processes on
emulated pods, with vLLM's real import (its env_override) and its own argument parser:
- under an 8 GiB limit (HAMi-core's variable, vgpu-manager's, vCUDA's resource_data_t) a server left at
  vLLM's default is given the fraction that fits, which vLLM's parser then reads; a user's 0.92 is kept
  and warned about with the value that fits; a later process replays the same;
- VLLM_ENABLE_CUDA_COMPATIBILITY under a layer that replaces libcuda.so.1: vLLM's own env_override does not
  put the compat directory first (auto), and in validate mode, where it does, the child's record says the
  layer is bypassed there instead of "no sharing layer"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "cc": "9.0"}

# A vLLM server's front, as the `vllm` command starts it: the guard runs at `import vllm`, then vLLM's own
# parser reads the command line (EngineArgs' arguments, after `serve MODEL`).
SERVE = """
import json, os, sys
sys.argv = ["/usr/local/bin/vllm", "serve", "MODEL", *json.loads(sys.argv[1])]
import vllm
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(["--model", *sys.argv[2:]])
print("RESULT " + json.dumps({"fraction": args.gpu_memory_utilization, "argv": sys.argv[1:],
    "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
    "compat": os.environ.get("VLLM_ENABLE_CUDA_COMPATIBILITY")}))
"""
EIGHT_GIB = 8 << 30


def _result(run) -> dict:
    assert run.returncode == 0, run.stderr[-2000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


# The same front with the guard alone (what vLLM's parser then reads is shown once, above, with vLLM).
SERVE_GUARD = """
import json, sys
sys.argv = ["/usr/local/bin/vllm", "serve", "MODEL"]
from vllm_tmaguard.guard import activate
activate("test")
print("RESULT " + json.dumps({"argv": sys.argv[1:]}))
"""


# vLLM's OpenAI server started as a module, `python -m vllm.entrypoints.openai.api_server`: the guard runs
# when `-m` imports the real `vllm` package, while argv[0] is still "-m" (launch.is_server reads the module's
# name from /proc/self/cmdline: process.module_run). The server module itself is found, by a finder that
# sitecustomize.py installs, in API_SERVER: vLLM's own parser reads the command line as the server's does,
# and no server starts.
API_SERVER = """
import json, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(sys.argv[1:])
print("RESULT " + json.dumps({"fraction": args.gpu_memory_utilization, "argv": sys.argv[1:]}))
"""
SITECUSTOMIZE = """
import importlib.util, os, sys
class ApiServer:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "vllm.entrypoints.openai.api_server":
            return importlib.util.spec_from_file_location(name, os.environ["TEST_API_SERVER"])
        return None
sys.meta_path.insert(0, ApiServer)
"""


def _api_server(directory: Path) -> dict[str, str]:
    """The environment that makes `python -m vllm.entrypoints.openai.api_server` run API_SERVER."""
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (directory / "api_server.py").write_text(API_SERVER)
    return {"PYTHONPATH": str(directory), "TEST_API_SERVER": str(directory / "api_server.py")}


def test_vllms_default_is_given_what_fits_each_layers_limit(pods, run_python, tmp_path) -> None:
    # HAMi-core's variable, through vLLM's own import and parser, the server started as vLLM's module.
    env = {"CUDA_DEVICE_MEMORY_LIMIT_0": "8g", **_api_server(tmp_path / "api-server")}
    module = "vllm.entrypoints.openai.api_server"
    hami = run_python(pods("hami", **H100), "", env, module=module, args=["--model", "MODEL"])
    assert _result(hami)["fraction"] == 0.84  # vLLM's own parser reads what the guard set
    assert hami.last_record()["trigger"] == "import-hook"  # `-m` imported vllm: the guard ran then
    layers = {
        "hami": hami,
        "vgpu-manager": run_python(pods("vgpu-manager", **H100), SERVE_GUARD),  # CUDA_MEM_LIMIT_0=8192m
        "vcuda": run_python(pods("vcuda", quota=EIGHT_GIB, **H100), SERVE_GUARD),  # vcuda.config's quota
    }
    for name, run in layers.items():
        record = run.last_record()
        assert _result(run)["argv"][-2:] == ["--gpu-memory-utilization", "0.84"], name
        assert record["memory"]["set_to"] == "0.84" and record["memory"]["limit_bytes"] == EIGHT_GIB
        (override,) = [
            o for o in record["routing"]["overrides"] if o["variable"] == "--gpu-memory-utilization"
        ]
        assert override["was"] == "0.92 (vLLM's default)" and override["now"] == "0.84"
        assert "--gpu-memory-utilization 0.84 set" in run.guard_lines()[0]
    # A later process of the pod replays the verdict, flag and all.
    pod = pods("vgpu-manager", **H100)
    first = run_python(pod, SERVE_GUARD, records="again").last_record()["pid"]
    again = run_python(pod, SERVE_GUARD, records="again")
    assert _result(again)["argv"][-1] == "0.84" and again.last_record()["replayed_from"] == first


def test_a_users_fraction_is_kept_and_warned_about_with_what_fits(pods, run_python) -> None:
    pod = pods("hami", **H100)
    run = run_python(
        pod, SERVE, {"CUDA_DEVICE_MEMORY_LIMIT_0": "8g"}, args=['["--gpu-memory-utilization", "0.92"]']
    )
    assert _result(run)["fraction"] == 0.92
    (line,) = run.guard_lines()
    assert "WARNING" in line and "fix: --gpu-memory-utilization 0.84" in line
    assert run.last_record()["problems"][0]["code"] == "memory-fraction-too-high"
    # TMAGUARD_MEMORY=warn: vLLM's default is said, not changed (the guard alone: the command line it leaves
    # is vLLM's parser's input, which the test above reads with vLLM).
    warned = run_python(
        pod, SERVE_GUARD, {"CUDA_DEVICE_MEMORY_LIMIT_0": "8g", "TMAGUARD_MEMORY": "warn"}, records="warned"
    )
    assert _result(warned)["argv"] == ["serve", "MODEL"] and "PROBLEM" in warned.guard_lines()[0]


# A child started from the server with a fresh loader (as vLLM's EngineCore is under spawn), whose own guard
# says which libcuda.so.1 it got.
PARENT_AND_CHILD = """
import os, subprocess, sys
import vllm  # vLLM's env_override: with the switch on, the compat directory first on LD_LIBRARY_PATH
print(f"PARENT {os.getpid()} " + os.environ.get("LD_LIBRARY_PATH", ""))
guard = "from vllm_tmaguard.guard import activate; activate('child')"  # the guard alone: which libcuda.so.1
subprocess.run([sys.executable, "-c", guard], check=True)
"""


def test_vllms_compat_switch_keeps_the_layer_in_force(pods, run_python, tmp_path) -> None:
    pod = pods("vcuda", quota=EIGHT_GIB, **H100)
    compat = (
        tmp_path / "compat"
    )  # a compat directory of the driver's own files, as the cuda-compat package has
    compat.mkdir()
    shutil.copy(pod.real_driver, compat / "libcuda.so.1")
    env = {"VLLM_ENABLE_CUDA_COMPATIBILITY": "1", "VLLM_CUDA_COMPATIBILITY_PATH": str(compat)}

    kept = run_python(pod, PARENT_AND_CHILD, env, records="kept")
    _, pid, path = next(line for line in kept.stdout.splitlines() if line.startswith("PARENT ")).split(" ", 2)
    assert str(compat) not in path  # the guard set the switch to 0 before env_override read it
    records = [json.loads(p.read_text()) for p in sorted(kept.record_dir.glob("process-*.json"))]
    assert len(records) == 2 and all(r["layers"][0]["name"] == "vcuda" for r in records)  # the child too
    (parent,) = [r for r in records if r["pid"] == int(pid)]  # what it changed, and why
    assert "compat-bypasses-layer" in [p["code"] for p in parent["problems"]]
    assert {"variable": "VLLM_ENABLE_CUDA_COMPATIBILITY", "now": "0"}.items() <= parent["routing"][
        "overrides"
    ][-1].items()

    # validate: vLLM's env_override does what it does, and the child is told it runs outside the layer.
    bypassed = run_python(pod, PARENT_AND_CHILD, {**env, "TMAGUARD_MODE": "validate"}, records="bypassed")
    parent = next(line for line in bypassed.stdout.splitlines() if line.startswith("PARENT "))
    _, pid, path = parent.split(" ", 2)
    assert path.split(":")[0] == str(compat)
    (child,) = [
        json.loads(p.read_text())
        for p in bypassed.record_dir.glob("process-*.json")
        if p.stem != f"process-{pid}"
    ]
    assert child["layers"][0]["name"] == "vcuda-bypassed" and "no sharing layer" not in child["summary"]
    assert child["problems"][0]["code"] == "layer-bypassed" and str(compat) in child["problems"][0]["cause"]

    # strict: start-up stops, naming the switch.
    stopped = run_python(pod, "import vllm", {**env, "TMAGUARD_STRICT": "1"}, records="strict")
    assert stopped.returncode != 0 and "VLLM_ENABLE_CUDA_COMPATIBILITY" in stopped.stderr
