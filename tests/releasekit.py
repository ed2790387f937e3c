"""The release files as scripts/build_wheels.sh builds them: the sdist and one wheel per architecture."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARCHES = ("x86_64", "aarch64")  # one manylinux_2_28 wheel each


@dataclass(frozen=True)
class Release:
    sdist: Path
    wheels: dict[str, Path]  # "x86_64" / "aarch64" -> the wheel
    printed: str  # the script's output
    seconds: float


def build_release(out: Path) -> Release:
    """Runs scripts/build_wheels.sh into `out`; fails with its output if it fails."""
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "build_wheels.sh"), "--install-cross-compiler", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"scripts/build_wheels.sh failed:\n{done.stdout}\n{done.stderr}"
    (sdist,) = out.glob("vllm_tmaguard-*.tar.gz")
    wheels = {arch: next(out.glob(f"vllm_tmaguard-*-py3-none-manylinux_2_28_{arch}.whl")) for arch in ARCHES}
    return Release(sdist, wheels, done.stdout, time.monotonic() - started)
