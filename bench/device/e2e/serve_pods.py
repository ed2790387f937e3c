"""The end-to-end acceptance run on a Hopper machine: vLLM 0.25.1's OpenAI-compatible server, default engine
settings (V1 EngineCore process, CUDA graphs, torch.compile), started from a fresh process tree in each pod,
then a fixed prompt set (greedy, 64 tokens, token ids returned) and vLLM's own serving benchmark at several
concurrencies, interleaved over the pods (bench_client.py). Each pod's results go to
STATE/results/<pod>/summary.json, with the server log, every guard record of every process and the
benchmark files.

usage: serve_pods.py POD [POD ...]   (pods: see PODS; state in $E2E_STATE, default /tmp/e2e, made by
setup.sh; the whole run of one call must end before the device's 10-minute limit)"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from vllm_tmaguard.stages.loader import resolve_library  # noqa: E402

STATE = Path(os.environ.get("E2E_STATE", "/tmp/e2e"))
MODEL = STATE / "model"
PYTHON = sys.executable
READY_TIMEOUT_S = float(os.environ.get("E2E_READY_S", "420"))
# concurrency: prompts (E2E_PROMPT_SCALE shortens a run that must fit the device's time)
CONCURRENCY = {
    c: max(c, round(n * float(os.environ.get("E2E_PROMPT_SCALE", "1"))))
    for c, n in {1: 24, 8: 96, 64: 384}.items()
}
ROUNDS = int(os.environ.get("E2E_ROUNDS", "1"))
# Every pod's server runs at the same time on the one GPU, so that the benchmark can interleave them: a
# fixed KV cache (skips vLLM's memory profiling, which other processes' allocations would disturb) and a
# memory fraction that the servers' free-memory check at start-up leaves room for. ~7 GiB each. A pod whose
# layer shows the process its quota as the device (vCUDA, HAMi-core) keeps vLLM's defaults: its KV cache is
# sized from the quota.
KV_BYTES = int(os.environ.get("E2E_KV_GIB", "4")) << 30
SHARED_GPU = ("--gpu-memory-utilization", "0.1", "--kv-cache-memory-bytes", str(KV_BYTES))
# E2E_SAME_ENGINE=1: every pod, a layer's too, runs the same engine settings (SHARED_GPU), so that a
# difference in tokens is the layer's, not vLLM's choices from a smaller device (CUDA-graph sizes, KV cache).
SAME_ENGINE = os.environ.get("E2E_SAME_ENGINE", "0") == "1"
# E2E_TP: tensor parallel size (vLLM's EngineCore then starts one worker process per GPU).
PARALLEL = ("--tensor-parallel-size", os.environ.get("E2E_TP", "1"))
QUOTA_SHOWN = (
    "real:vcuda-master", "real:vcuda-v1.0.5", "real:vcuda-fork", "real:hami", "real:hami-8c32de6",
    "real:hami-93cf05d", "real:vgpu-manager",
)  # fmt: skip
MAX_TOKENS = 64
# E2E_LOGPROBS=N: each prompt's answer keeps the top N logprobs at every position, so that a token that
# differs from bare's can be told apart as a near tie (bare's top two within rounding) or a wrong number
# (logprobs on the common prefix far from bare's).
LOGPROBS = int(os.environ.get("E2E_LOGPROBS", "0"))

COMPAT_ON = {"VLLM_ENABLE_CUDA_COMPATIBILITY": "1", "VLLM_CUDA_COMPATIBILITY_PATH": "/tmp/compat"}
# pod: (layer shape or None for the bare driver, extra environment, what it is). "real:POD" is a real layer
# built from its source, in its device plugin's layout (bench/device/real_layers/pod.sh).
PODS = {
    "a": (None, {}, "bare: the real driver"),
    "vm": ("real:vcuda-master", {}, "tkestack vCUDA master (8 GiB quota), guard installed, nothing set"),
    "v105": ("real:vcuda-v1.0.5", {}, "tkestack vCUDA v1.0.5 (8 GiB quota), guard installed, nothing set"),
    "hami": ("real:hami", {}, "HAMi-core (its limit: QUOTA_HAMI), guard installed, nothing set"),
    "b": ("upstream", {"TMAGUARD_MODE": "off"}, "emulated upstream vCUDA, guard off"),
    "c": ("upstream", {}, "emulated upstream vCUDA, guard installed, nothing set"),
    "d": ("network", {"LUPINE_SERVER": "10.0.0.1:9999"}, "network layer: no real encoder reachable"),
    "e-latency": (None, {"TMAGUARD_GEMM": "latency"}, "bare, TMAGUARD_GEMM=latency"),
    "e-portable": (None, {"TMAGUARD_GEMM": "portable"}, "bare, TMAGUARD_GEMM=portable"),
    "a2": (None, {}, "bare again: the noise floor"),
    # The other layers operators run (issue 26), each as its device plugin lays it out (pod.sh); a fourth
    # element: vLLM flags the layer needs, as the guard's record names them.
    "fork": ("real:vcuda-fork", {}, "the CUDA-12 vCUDA fork (8 GiB quota), guard installed, nothing set"),
    "fork-whole": (
        "real:vcuda-fork+whole", {},
        "the vCUDA fork as gpu-manager sets it up for whole GPUs (no limit), guard installed, nothing set",
    ),
    "vgm": ("real:vgpu-manager", {}, "vgpu-manager (8 GiB limit), guard installed, nothing set"),
    "hv12": ("real:hami-8c32de6", {}, "HAMi-core at Volcano v1.12.0's pin, guard installed, nothing set"),
    "hv10": ("real:hami-93cf05d", {}, "HAMi-core at Volcano v1.10.0's pin, guard installed, nothing set"),
    "nvs": (
        "real:nvshare", {}, "nvshare (its scheduler up), CUDA graphs off as the guard's record says",
        ("--compilation-config", '{"cudagraph_mode": "NONE"}'),
    ),
    "lup": (
        "real:lupine", {"LUPINE_LOG_LEVEL": "error"}, "lupine over loopback, fp32 as the guard's record says",
        ("--dtype", "float32"),
    ),
    "a32": (None, {}, "bare, --dtype float32 (lupine's reference)", ("--dtype", "float32")),
    # vLLM's compat switch on, its directory a copy of the driver's own files (issue 32): made by launch.sh.
    "vm-compat": (
        "real:vcuda-master", COMPAT_ON,
        "tkestack vCUDA master (8 GiB quota), VLLM_ENABLE_CUDA_COMPATIBILITY=1, guard installed",
    ),
    "fork-compat": (
        "real:vcuda-fork", COMPAT_ON,
        "the vCUDA fork (8 GiB quota), VLLM_ENABLE_CUDA_COMPATIBILITY=1, guard installed",
    ),
}


def real_driver() -> str:
    return os.path.realpath(resolve_library("libcuda.so.1", {}).path or "")


POD_SH = ROOT / "bench/device/real_layers/pod.sh"
# What a real-layer pod's processes get (pod.sh starts them with `env -i`): the run's own settings.
PASSED = (
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "VLLM_NO_USAGE_STATS",
    "VLLM_USE_FLASHINFER_SAMPLER",
    "DO_NOT_TRACK",
    "TMAGUARD_RECORD_DIR",
    "VLLM_CACHE_ROOT",
    "CUDA_CACHE_PATH",
    "CUDA_CACHE_MAXSIZE",
    "TMPDIR",
    "E2E_PROBE_DIR",
    "E2E_PROBE_BYTES",
)
# E2E_PROBE=1: every Python process of a pod runs probe/sitecustomize.py; once the server has answered its
# prompts each process with a CUDA context says what cudaMemGetInfo shows it and whether an allocation past
# the layer's limit (E2E_PROBE_BYTES, default 10 GiB) is refused: the limit in the EngineCore and workers.
PROBE = os.environ.get("E2E_PROBE", "0") == "1"


def build_pod(name: str, shape: str | None) -> dict[str, str]:
    """The pod's extra environment: its libcuda.so.1 directory and file-system root, for layer pods."""
    if shape is None or shape.startswith("real:"):
        return {}
    pod = STATE / f"pod-{shape}"
    lib, root = pod / "lib", pod / "root"
    if not (lib / "libcuda.so.1").exists():
        lib.mkdir(parents=True, exist_ok=True)
        real = real_driver()
        if shape == "network":  # no driver file beside the layer: it opens one by its own absolute path
            target = real
        else:  # vCUDA: the real driver beside the layer
            target = str(lib / os.path.basename(real))
            os.symlink(real, target)
            (root / "etc/vcuda").mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [PYTHON, str(ROOT / "bench/device/make_layer.py"), target, str(lib / "libcuda.so.1"), shape],
            check=True,
        )
        root.mkdir(parents=True, exist_ok=True)
    return {"LD_LIBRARY_PATH": str(lib), "TMAGUARD_ROOT": str(root)}


def base_environ() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TMAGUARD_", "VLLM_", "LD_"))}
    env.update(
        {
            "PYTHONPATH": f"{STATE / 'site'}:{STATE / 'v25'}",
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            # FlashInfer (flashinfer-python, flashinfer-cubin: several hundred MB) is not carried: vLLM's
            # own PyTorch top-k/top-p sampler instead (greedy decoding does not use either).
            "VLLM_USE_FLASHINFER_SAMPLER": "0",
            "DO_NOT_TRACK": "1",
        }
    )
    return env


def get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except Exception:
        return 0


def wait_ready(servers: list[Server]) -> None:
    """Polls every server's /health together until each answers 200 or exits: each one's ready time is
    its own (from its start to its first 200), whatever order the servers come up in."""
    pending = list(servers)
    while pending and time.monotonic() - min(s.started for s in pending) < READY_TIMEOUT_S:
        for server in list(pending):
            if server.process.poll() is not None:
                server.summary.update(ready_s=None, exit_code=server.process.poll())
                pending.remove(server)
            elif get(f"http://127.0.0.1:{server.port}/health") == 200:
                server.summary["ready_s"] = time.monotonic() - server.started
                pending.remove(server)
        time.sleep(0.25)
    for server in pending:
        server.summary.update(ready_s=None, exit_code=server.process.poll())


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (API server, engine core, their helpers), SIGKILL after a
    minute; returns once no process of the group is left, so the next pod finds the GPU free."""

    def group_alive() -> bool:
        try:
            os.killpg(process.pid, 0)
            return True
        except ProcessLookupError:
            return False

    for sig, grace in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        if group_alive():
            os.killpg(process.pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            process.poll()
            if not group_alive():
                return
            time.sleep(0.5)


def complete_prompts(port: int) -> list[dict]:
    """The fixed prompts one at a time (the same batch shape in every pod), greedy, 64 tokens, ids back."""
    sys.path.insert(0, str(STATE / "site"))
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120)
    outputs = []
    prompts = json.loads((MODEL / "prompts.json").read_text())
    for prompt in prompts[: int(os.environ.get("E2E_PROMPT_COUNT", len(prompts)))]:
        response = client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"return_token_ids": True, "ignore_eos": True},
            logprobs=LOGPROBS or None,
        )
        choice = response.choices[0]
        output = {"text": choice.text, "token_ids": getattr(choice, "token_ids", None)}
        if LOGPROBS and choice.logprobs:  # per position: the chosen token's logprob and the top ones'
            output["logprobs"] = choice.logprobs.token_logprobs
            output["top"] = [sorted(top.values(), reverse=True) for top in choice.logprobs.top_logprobs]
        outputs.append(output)
    return outputs


def core_sets(servers: int) -> tuple[list[set[int]] | list[None], set[int] | None]:
    """E2E_PIN_CORES=1: a disjoint set of CPUs for each server and the rest for the benchmark client, so that
    servers do not take cores from each other (serving this small model is host-bound); else no pinning."""
    if os.environ.get("E2E_PIN_CORES", "0") != "1":
        return [None] * servers, None
    cpus = sorted(os.sched_getaffinity(0))
    per = max(1, (len(cpus) - 2) // servers)
    return [set(cpus[i * per : (i + 1) * per]) for i in range(servers)], set(cpus[servers * per :]) or None


def pinned(cores: set[int] | None) -> Callable[[], None] | None:
    """A preexec_fn that keeps the child on `cores` (None: no pinning)."""
    return (lambda: os.sched_setaffinity(0, cores)) if cores else None


def bench_all(servers: list[Server], env: dict[str, str], deadline: float, cores: set[int] | None) -> None:
    """The serving benchmark for every ready pod, from one client process (bench_client.py)."""
    plan = {
        "pods": [{"name": s.name, "port": s.port, "out": str(s.out)} for s in servers],
        "model": str(MODEL),
        "concurrency": {str(c): n for c, n in CONCURRENCY.items()},
        "rounds": ROUNDS,
        "deadline": deadline,
        "results": str(STATE / "results" / "bench.json"),
    }
    plan_file = STATE / "results" / "bench-plan.json"
    plan_file.write_text(json.dumps(plan, indent=1))
    client = [PYTHON, str(ROOT / "bench/device/e2e/bench_client.py"), str(plan_file)]
    with open(STATE / "results" / "bench.log", "w") as log:
        limit = deadline - time.time() + 120  # the last run that started before the deadline ends
        try:
            subprocess.run(
                client, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=limit, preexec_fn=pinned(cores)
            )
        except subprocess.TimeoutExpired:
            print("the benchmark client outlived the call's budget: killed", file=log)
    results = json.loads(Path(plan["results"]).read_text()) if Path(plan["results"]).exists() else {}
    for server in servers:
        server.summary["bench"] = results.get(server.name, {})


KERNEL_LINES = re.compile(
    r"Using \S+ for \S+LinearMethod|Using FlashAttention version \d|FLASH_ATTN|backend|"
    r"Using \S+Kernel|illegal|undefined symbol|Error|Traceback|CUDA graph|torch.compile takes|"
    r"Compiling a graph|init engine|Memory profiling|Available KV cache",
    re.IGNORECASE,
)


class Server:
    """One pod's `vllm serve`, in a process group of its own (a fresh process tree)."""

    def __init__(self, name: str, port: int, cores: set[int] | None) -> None:
        base, _, fraction = name.partition("@")  # POD@0.85: the pod with --gpu-memory-utilization 0.85
        shape, extra, what, *flags = PODS[base]
        if fraction:
            flags = [(*(flags[0] if flags else ()), "--gpu-memory-utilization", fraction)]
            what += f", --gpu-memory-utilization {fraction}"
        self.name, self.port = name, port
        self.out = STATE / "results" / name
        self.out.mkdir(parents=True)
        pod_env = {**build_pod(name, shape), **extra}
        env = {
            **base_environ(),
            **pod_env,
            "TMAGUARD_RECORD_DIR": str(self.out / "records"),
            # One torch.compile cache: pods of one configuration run the same compiled code (inductor
            # picks some kernels by timing them, so separate compiles differ in rounding).
            "VLLM_CACHE_ROOT": str(STATE / "cache"),
            # FlashAttention-2 has only compute_80 PTX for Hopper: the driver compiles it at first use
            # (minutes); a persistent, large JIT cache lets the next FA2 pod reuse that.
            "CUDA_CACHE_PATH": str(STATE / "nv-cache"),
            "CUDA_CACHE_MAXSIZE": str(4 << 30),
        }
        if PROBE:
            (self.out / "probe").mkdir()
            env["E2E_PROBE_DIR"] = str(self.out / "probe")
            env["PYTHONPATH"] = f"{ROOT / 'bench/device/e2e/probe'}:{env['PYTHONPATH']}"
        engine = () if shape in QUOTA_SHOWN and not SAME_ENGINE else SHARED_GPU
        command = [
            PYTHON, "-m", "vllm.entrypoints.cli.main", "serve", str(MODEL), "--served-model-name", "tiny",
            "--port", str(port), "--seed", "0", *engine, *PARALLEL, *(flags[0] if flags else ()),
        ]  # fmt: skip
        if shape and shape.startswith("real:"):
            passed = [f"{k}={v}" for k, v in env.items() if k in PASSED or k in pod_env]
            command = ["bash", str(POD_SH), shape.removeprefix("real:"), *passed, "--", *command]
        self.summary: dict = {"pod": name, "what": what, "shape": shape, "env": pod_env}
        self.summary["cores"] = sorted(cores) if cores else None
        self.summary["command"] = " ".join(command)
        self.log = open(self.out / "server.log", "w")  # noqa: SIM115 - open while the server runs
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=STATE,
            preexec_fn=pinned(cores),
        )

    def probe(self, wait_s: float = 30.0) -> None:
        """SIGWINCH to each process the probe noted (never the process group: bash and unshare would die of
        it); collects the answers of those alive."""
        probe_dir = self.out / "probe"
        asked = []
        for note in sorted(probe_dir.glob("pid-*")):
            pid = int(note.name.removeprefix("pid-"))
            try:
                os.kill(pid, signal.SIGWINCH)
                asked.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        answered = lambda: all((probe_dir / f"result-{pid}.json").exists() for pid in asked)  # noqa: E731
        while time.monotonic() < deadline and not answered():
            time.sleep(0.5)
        results = []
        for pid in asked:
            path = probe_dir / f"result-{pid}.json"
            results.append(json.loads(path.read_text()) if path.exists() else {"pid": pid, "answer": None})
        self.summary["probe"] = results
        for result in results:
            if result.get("cuda") or result.get("probe_error"):
                gib = {k: result.get(k, 0) / 2**30 for k in ("total", "free", "asked")}
                print(
                    f"PROBE {self.name} {result['pid']} {result.get('title')}: cuda:{result.get('device')}"
                    f" total {gib['total']:.2f} GiB, free {gib['free']:.2f} GiB; {gib['asked']:.0f} GiB more:"
                    f" {result.get('past_limit')} {result.get('probe_error', '')}",
                    flush=True,
                )

    def finish(self) -> dict:
        stop(self.process)
        self.log.close()
        text = (self.out / "server.log").read_text(errors="replace")
        lines = text.splitlines()
        self.summary["guard_lines"] = [line for line in lines if line.startswith("(tmaguard pid=")]
        self.summary["log_lines"] = [line[:400] for line in lines if KERNEL_LINES.search(line)][:80]
        self.summary["log_tail"] = lines[-25:]
        records = self.out / "records"
        files = sorted(records.glob("process-*.json")) if records.is_dir() else []
        self.summary["records"] = [json.loads(p.read_text()) for p in files]
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1))
        return self.summary


def main() -> None:
    """Starts the first named pod alone (it fills the compile and JIT caches; E2E_FIRST_ALONE=0: all at
    once), then every other one at once; then, for the pods that became ready: the prompt set one pod
    after another, and the benchmark (bench_client.py). E2E_BUDGET_S: seconds from start after which no
    further benchmark starts (the call must end before the device's 10-minute limit); E2E_PIN_CORES: see
    core_sets."""
    wall_deadline = time.time() + float(os.environ.get("E2E_BUDGET_S", "500"))
    names = sys.argv[1:]
    shutil.rmtree(STATE / "results", ignore_errors=True)  # a warm machine keeps the last call's
    alone = 1 if os.environ.get("E2E_FIRST_ALONE", "1") == "1" else 0
    server_cores, client_cores = core_sets(len(names))
    servers = [Server(name, 8100 + index, server_cores[index]) for index, name in enumerate(names[:alone])]
    wait_ready(servers)
    for index, name in enumerate(names[alone:], start=alone):
        servers.append(Server(name, 8100 + index, server_cores[index]))
        time.sleep(2)
    wait_ready(servers[alone:])
    ready = [server for server in servers if server.summary.get("ready_s") is not None]
    client_env = {**base_environ(), "TMAGUARD_MODE": "off"}
    try:
        for server in ready if os.environ.get("E2E_PROMPTS", "1") == "1" else ():
            try:
                server.summary["outputs"] = complete_prompts(server.port)
            except Exception as error:  # a failing step is a result
                server.summary["error"] = f"{type(error).__name__}: {error}"
        for server in ready if PROBE else ():
            server.probe()
        bench_all(ready, client_env, wall_deadline, client_cores)
    finally:
        for server in servers:
            summary = server.finish()
            tok_s = {
                c: [round(r.get("output_throughput") or 0) for r in runs]
                for c, runs in summary.get("bench", {}).items()
            }
            print(
                f"POD {server.name}: ready {summary['ready_s']} s, exit {summary.get('exit_code')}, "
                f"{len(summary['records'])} records, output tok/s {tok_s}, error {summary.get('error')}",
                flush=True,
            )


if __name__ == "__main__":
    main()
