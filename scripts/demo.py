"""The main job, shown on an emulated vCUDA pod (docs/design.md §6.1): vLLM 0.32.0's real CUDA platform import
fails without the guard and works with it. Run through scripts/demo.sh; `scripts/demo.sh doctor` runs
`tmaguard doctor` on the same pod. The pod and the guard's records stay in build/demo/ (`--build DIR`: in
DIR instead, as the tests run it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from podkit import Pod, build_pod, child_environ  # noqa: E402

DEMO = ROOT / "build" / "demo"
START_VLLM = """
from vllm.platforms import current_platform
import torch
ops = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("_C::")]
print(f"vLLM started its CUDA platform: {type(current_platform).__name__}, {len(ops)} vLLM ops registered")
"""


def records(demo: Path) -> Path:
    return demo / "records"


def pod_env(demo: Path) -> Path:
    """The pod's variables, for `scripts/demo.sh doctor`."""
    return demo / "pod.json"


def shown(path: Path) -> Path:
    """`path` as the demo prints it: from the repository's root where it is inside it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def emulated_pod(demo: Path) -> Pod:
    shutil.rmtree(demo, ignore_errors=True)
    demo.mkdir(parents=True)
    pod = build_pod(demo, "vcuda")
    pod_env(demo).write_text(json.dumps(pod.env))
    return pod


def run_vllm(pod: Pod, demo: Path, extra: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", START_VLLM],
        env=child_environ(pod, records(demo), extra),
        capture_output=True,
        text=True,
        cwd=demo,
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    shown = [line for line in lines if line.startswith(("(tmaguard", "vLLM started"))]
    for line in shown or lines[-1:]:
        print(f"   {line}")
    print(f"   (exit status {done.returncode})")


def main(demo: Path) -> None:
    pod = emulated_pod(demo)
    print(f"\nEmulated vCUDA pod in {shown(pod.root)}: its libcuda.so.1 is a vCUDA-like layer")
    print("without cuTensorMapEncodeTiled, the real driver beside it; NVML reports one RTX 4090.\n")
    print("1. vLLM 0.32.0 without the guard (TMAGUARD_MODE=off):")
    run_vllm(pod, demo, {"TMAGUARD_MODE": "off"})
    print("2. vLLM 0.32.0 with the guard (nothing set):")
    run_vllm(pod, demo, {})
    print(f"\nThe guard's full record: {shown(records(demo) / 'last.json')}")
    build = "" if demo == DEMO else f"--build {demo} "
    print(f"The doctor on this pod:  bash scripts/demo.sh {build}doctor")


def doctor(demo: Path) -> int:
    """`tmaguard doctor` inside the pod the demo ran vLLM in (with its records)."""
    if not pod_env(demo).exists():
        main(demo)
    env = child_environ(None, records(demo), json.loads(pod_env(demo).read_text()))
    env["COLUMNS"] = os.environ.get("COLUMNS", "100")
    return subprocess.run([str(Path(sys.executable).parent / "tmaguard"), "doctor"], env=env).returncode


if __name__ == "__main__":
    args = sys.argv[1:]
    build = DEMO
    if args[:1] == ["--build"] and len(args) >= 2:
        build, args = Path(args[1]).resolve(), args[2:]
    if args == ["doctor"]:
        raise SystemExit(doctor(build))
    if args:
        raise SystemExit("usage: demo.sh [--build DIR] [doctor]")
    main(build)
