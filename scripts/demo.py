"""The main job, shown on an emulated vCUDA pod (DESIGN.md §5): vLLM 0.32.0's real CUDA platform import
fails without the guard and works with it. Run through scripts/demo.sh."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from podkit import build_pod

RESOLVE = """
from vllm.platforms import current_platform
import torch
ops = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("_C::")]
print(f"vLLM platform: {type(current_platform).__name__}, {len(ops)} vLLM ops registered")
"""


def run(title: str, env: dict[str, str]) -> None:
    print(f"\n=== {title}")
    done = subprocess.run([sys.executable, "-c", RESOLVE], env=env, capture_output=True, text=True)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    shown = [line for line in lines if "tmaguard" in line or "vLLM platform" in line]
    print("\n".join(shown or lines[-1:]))
    print(f"(exit code {done.returncode})")


def main() -> None:
    with tempfile.TemporaryDirectory() as base:
        pod = build_pod(Path(base), "vcuda")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TMAGUARD_", "LD_", "VLLM_"))}
        env.update(pod.env, TMAGUARD_RECORD_DIR=os.path.join(base, "records"))
        print(
            f"Emulated vCUDA pod at {pod.root}: libcuda.so.1 = vCUDA-like layer (no cuTensorMapEncodeTiled),"
        )
        print("real driver libcuda.so.550.142 beside it, NVML reports one RTX 4090.")
        run("vLLM 0.32.0 without the guard (TMAGUARD_MODE=off)", {**env, "TMAGUARD_MODE": "off"})
        run("vLLM 0.32.0 with the guard (nothing set)", env)


if __name__ == "__main__":
    main()
