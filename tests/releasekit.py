"""The release files as scripts/build_wheels.sh builds them: the sdist and one wheel per architecture."""

from __future__ import annotations

import fcntl
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


def shared_release(directory: Path) -> Release:
    """The release built once into `directory` for every test process that asks (pytest-xdist's workers
    share their base directory's parent): the first builds it under a lock, the others read what it left
    (the wheels, and the script's output in printed.txt). The build writes in the repository's build/, so two
    at once would spoil each other's."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        printed, seconds = directory / "printed.txt", directory / "seconds.txt"
        if not printed.exists():
            built = build_release(directory / "dist")
            seconds.write_text(str(built.seconds))
            printed.write_text(built.printed)
            return built
    out = directory / "dist"
    (sdist,) = out.glob("vllm_tmaguard-*.tar.gz")
    wheels = {arch: next(out.glob(f"vllm_tmaguard-*-py3-none-manylinux_2_28_{arch}.whl")) for arch in ARCHES}
    return Release(sdist, wheels, printed.read_text(), float(seconds.read_text()))
