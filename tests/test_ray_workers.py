"""vLLM's Ray workers, each guarded in its own process with its own record, with the toggles set only in the
head's vLLM process (docs/design.md §3.4). A real Ray cluster (Ray 2.60, the version hidden checks ran) of two
nodes on this machine, each its own emulated pod: the head's raylet in an H100 pod, the worker's in an
emulated vCUDA H100 pod, each with its own environment (TMAGUARD_ROOT, record directory, libraries), neither
with a toggle. The worker node's Python is one whose site-packages the package reaches by PYTHONPATH only (its
.pth is never read, as with runtime_env py_modules or working_dir): the job's `worker_process_setup_hook`
(vllm_tmaguard.ray_hook.setup) arms the guard there. The driver runs as vLLM's engine does: vLLM imported
(its guard sets the runtime-env hook), then `ray.init`; its actors import vLLM as they are created, as vLLM's
RayWorkerWrapper does, before the executor copies any variable to them; then vLLM's own copy
(get_env_vars_to_copy, update_environment_variables) runs, as RayDistributedExecutor runs it.

Ray's start-up makes this the expensive test of the deploy work: two `ray start`s (~6 s each here) and three
vLLM imports."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest
import ray  # noqa: F401  (the test needs Ray in this environment: scripts/setup_env.sh installs it)
from podkit import child_environ, guard_lines

H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "cc": "9.0"}
SITE = sysconfig.get_paths()["purelib"]
BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"

DRIVER = r"""
import json, os, sys
import vllm  # the guard: the head's toggles, and the hook that carries them to the job's workers
import ray
from vllm.ray.ray_env import get_env_vars_to_copy
from vllm_tmaguard.guard import activate

ray.init(address=sys.argv[1], logging_level="ERROR",
         runtime_env={"worker_process_setup_hook": "vllm_tmaguard.ray_hook.setup"})

@ray.remote(num_cpus=0)
class Worker:
    # As vLLM's RayWorkerWrapper: vLLM imported as the actor is created.
    def __init__(self):
        self.started = {k: v for k, v in os.environ.items() if k.startswith("TMAGUARD_")}
        import vllm  # noqa: F401
        from vllm_tmaguard.guard import activate
        self.record = activate("not armed: this process's first activation")  # else the import's record

    def report(self):
        return {"pid": os.getpid(), "python": sys.executable, "started": self.started, "record": self.record}

    def update(self, env):  # vLLM's copy, after the actors exist (RayDistributedExecutor)
        from vllm.utils.system_utils import update_environment_variables
        update_environment_variables(env)
        return {k: v for k, v in os.environ.items() if k.startswith("TMAGUARD_")}

workers = [Worker.options(resources={node: 0.01}).remote() for node in ("head-pod", "worker-pod")]
reports = ray.get([w.report.remote() for w in workers], timeout=300)
names = get_env_vars_to_copy()
copied = {k: os.environ[k] for k in names if k in os.environ}
after = ray.get([w.update.remote(copied) for w in workers], timeout=60)
print("RESULT " + json.dumps({
    "driver": activate("driver"), "hook": os.environ.get("RAY_RUNTIME_ENV_HOOK"),
    "workers": reports, "copied": sorted(k for k in copied if k.startswith("TMAGUARD_")), "after": after,
}))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ray_start(python: str, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """`ray start` (returns once the node is up; its daemons stay in the new session it starts)."""
    command = [python, "-m", "ray.scripts.scripts", "start", "--disable-usage-stats", "--num-cpus=1",
               "--num-gpus=0", "--object-store-memory=100000000", *args]  # fmt: skip
    with open(log, "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        assert process.wait(timeout=120) == 0, log.read_text()
    return process


def _stop(sessions: list[int], temp_dir: str) -> None:
    """Ends the processes this test started: the two sessions' daemons, then any process of this cluster
    (its temporary directory in the command line: the workers Ray starts in sessions of their own)."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for session in sessions:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(session, signum)
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    command = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if temp_dir.encode() in command and int(entry.name) != os.getpid():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(entry.name), signum)
        time.sleep(1)


@pytest.mark.long
def test_ray_workers_get_the_heads_toggles_and_their_own_records(pods, tmp_path) -> None:
    head_pod, worker_pod = pods("bare", **H100), pods("vcuda", **H100)
    head_records, worker_records = tmp_path / "head-records", tmp_path / "worker-records"
    head_env = child_environ(head_pod, head_records, {"RAY_USAGE_STATS_ENABLED": "0"})
    pth = Path(SITE) / "zz_main_venv.pth"  # a worktree's venv sees the main one's packages (its .pth)
    main_site = pth.read_text().strip() if pth.exists() else ""
    worker_env = child_environ(worker_pod, worker_records, {
        "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": os.pathsep.join(filter(None, [SITE, main_site])),
    })  # fmt: skip
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # a socket's path must fit in 107 bytes
    port = _free_port()
    sessions: list[int] = []
    try:
        started = time.monotonic()
        head = _ray_start(sys.executable, ["--head", "--include-dashboard=false", f"--port={port}",
                                           "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
                                           '--resources={"head-pod": 1}'],
                          head_env, tmp_path / "head.log")  # fmt: skip
        sessions.append(head.pid)
        worker = _ray_start(str(BASE_PYTHON), [f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1",
                                               '--resources={"worker-pod": 1}'],
                            worker_env, tmp_path / "worker.log")  # fmt: skip
        sessions.append(worker.pid)
        cluster_up = time.monotonic() - started
        driver = subprocess.run(
            [sys.executable, "-c", DRIVER, f"127.0.0.1:{port}"],
            env={**head_env, "TMAGUARD_GEMM": "portable"},  # the toggle, in the head's vLLM process only
            capture_output=True, text=True, timeout=400, cwd=tmp_path,
        )  # fmt: skip
    finally:
        _stop(sessions, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    guard_lines(driver.stdout)
    lines = [line for line in driver.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"{driver.stdout}\n{driver.stderr}"
    result = json.loads(lines[-1].removeprefix("RESULT "))
    print(f"cluster up in {cluster_up:.1f} s; the whole test {time.monotonic() - started:.1f} s")

    # The head's guard set the hook (no hook of the user's) and vLLM's copy list, and routed as asked.
    assert result["hook"] == "vllm_tmaguard.ray_hook.runtime_env_hook"
    assert result["driver"]["routing"]["env"]["RAY_RUNTIME_ENV_HOOK"] == result["hook"]
    on_head, on_worker = result["workers"]
    for report, records in ((on_head, head_records), (on_worker, worker_records)):
        # The toggle was there when the actor's process started, before vLLM's copy: the job's runtime env.
        assert report["started"].get("TMAGUARD_GEMM") == "portable", report["started"]
        record = report["record"]
        assert record["pid"] == report["pid"] != result["driver"]["pid"]
        assert record["trigger"] == "import-hook", record["trigger"]  # armed before `import vllm`
        # TMAGUARD_GEMM=portable on an H100 with a real encoder: Machete off (auto would keep it).
        assert "MacheteLinearKernel" in record["routing"]["env"].get("VLLM_DISABLED_KERNELS", ""), record
        assert json.loads((records / f"process-{report['pid']}.json").read_text())["pid"] == report["pid"]
    # Each pod's own files and paths: the worker's guard read the vCUDA pod and wrote its record there.
    assert on_head["started"]["TMAGUARD_ROOT"] == str(head_pod.root)
    assert on_worker["started"]["TMAGUARD_ROOT"] == str(worker_pod.root)
    assert [layer["name"] for layer in on_worker["record"]["layers"]] == ["vcuda"]
    assert "load-overlay" in [a["kind"] for a in on_worker["record"]["actions"]]
    assert not on_head["record"]["layers"]
    # The worker node's Python reads no .pth of the package's: the setup hook armed the guard there.
    assert on_worker["python"] == str(BASE_PYTHON) and on_head["python"] == sys.executable
    # vLLM's own copy (get_env_vars_to_copy) now carries the toggle, not the pod-local paths.
    assert result["copied"] == ["TMAGUARD_GEMM"]
    assert [a["TMAGUARD_ROOT"] for a in result["after"]] == [str(head_pod.root), str(worker_pod.root)]
