"""The main job, shown on an emulated vCUDA pod (docs/design.md §6.1): vLLM 0.32.0's real CUDA platform import
fails without the guard and works with it. Run through scripts/demo.sh; `scripts/demo.sh doctor` runs
`tmaguard doctor` on the same pod. The pod and the guard's records stay in build/demo/."""

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
RECORDS = DEMO / "records"
POD_ENV = DEMO / "pod.json"  # the pod's variables, for `scripts/demo.sh doctor`
START_VLLM = """
from vllm.platforms import current_platform
import torch
ops = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("_C::")]
print(f"vLLM started its CUDA platform: {type(current_platform).__name__}, {len(ops)} vLLM ops registered")
"""


def emulated_pod() -> Pod:
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir(parents=True)
    pod = build_pod(DEMO, "vcuda")
    POD_ENV.write_text(json.dumps(pod.env))
    return pod


def run_vllm(pod: Pod, extra: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", START_VLLM],
        env=child_environ(pod, RECORDS, extra),
        capture_output=True,
        text=True,
        cwd=DEMO,
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    shown = [line for line in lines if line.startswith(("(tmaguard", "vLLM started"))]
    for line in shown or lines[-1:]:
        print(f"   {line}")
    print(f"   (exit status {done.returncode})")


def main() -> None:
    pod = emulated_pod()
    print(f"\nEmulated vCUDA pod in {pod.root.relative_to(ROOT)}: its libcuda.so.1 is a vCUDA-like layer")
    print("without cuTensorMapEncodeTiled, the real driver beside it; NVML reports one RTX 4090.\n")
    print("1. vLLM 0.32.0 without the guard (TMAGUARD_MODE=off):")
    run_vllm(pod, {"TMAGUARD_MODE": "off"})
    print("2. vLLM 0.32.0 with the guard (nothing set):")
    run_vllm(pod, {})
    print(f"\nThe guard's full record: {(RECORDS / 'last.json').relative_to(ROOT)}")
    print("The doctor on this pod:  bash scripts/demo.sh doctor")


def doctor() -> int:
    """`tmaguard doctor` inside the pod the demo ran vLLM in (with its records)."""
    if not POD_ENV.exists():
        main()
    env = child_environ(None, RECORDS, json.loads(POD_ENV.read_text()))
    env["COLUMNS"] = os.environ.get("COLUMNS", "100")
    return subprocess.run([str(Path(sys.executable).parent / "tmaguard"), "doctor"], env=env).returncode


if __name__ == "__main__":
    if sys.argv[1:] == ["doctor"]:
        raise SystemExit(doctor())
    main()
