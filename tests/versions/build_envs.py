"""Builds (or reuses, where its stamp matches) one virtualenv per vLLM release, with uv: its cache sits beside
the venvs on the same file system, so the files releases share (CUDA libraries, torch) are hard links, not
copies. Then installs this package, built once, into every venv. Run with .venv's Python (setup_env.sh).

Usage: python tests/versions/build_envs.py [RELEASE ...]   (default: every release)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from releases import BY_VERSION, DEFAULT_RELEASE, RELEASES, ROOT, VENVS, WORK, Release

UV_VERSION = "0.13.9"
UV = WORK / "uv" / "bin" / "uv"
WHEELS = WORK / "wheel"


def run(*command: str | Path, env: dict[str, str] | None = None) -> None:
    subprocess.run([str(c) for c in command], check=True, env=env, timeout=3600)


def uv_env() -> dict[str, str]:
    return {**os.environ, "UV_CACHE_DIR": str(WORK / "cache"), "UV_LINK_MODE": "hardlink"}


def ensure_uv() -> None:
    if not UV.exists():
        run(sys.executable, "-m", "venv", WORK / "uv")
        run(WORK / "uv/bin/python", "-m", "pip", "install", "-q", f"uv=={UV_VERSION}")


def build_release(release: Release) -> None:
    stamp = release.venv / f".tmaguard-release-{release.stamp()}"
    if stamp.exists():
        return
    started = time.monotonic()
    print(f"building {release.venv} (vLLM {release.vllm}, torch {release.torch})", flush=True)
    shutil.rmtree(release.venv, ignore_errors=True)
    base_python = getattr(sys, "_base_executable", sys.executable)
    run(UV, "venv", "-q", "--python", base_python, release.venv, env=uv_env())
    install = [UV, "pip", "install", "-q", "--python", release.python]
    run(*install, f"torch==={release.torch}", *release.deps, env=uv_env())
    run(*install, "--no-deps", f"vllm=={release.vllm}", env=uv_env())
    stamp.touch()
    print(f"built vLLM {release.vllm} in {time.monotonic() - started:.0f} s", flush=True)


def install_guard(releases: list[Release]) -> None:
    """This package, as a wheel built once from the source tree, into every release venv."""
    shutil.rmtree(WHEELS, ignore_errors=True)
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", WHEELS, ROOT)
    (wheel,) = WHEELS.glob("vllm_tmaguard-*.whl")
    for release in releases:
        run(
            UV,
            "pip",
            "install",
            "-q",
            "--python",
            release.python,
            "--no-deps",
            "--reinstall",
            wheel,
            env=uv_env(),
        )


def main(names: list[str]) -> None:
    unknown = [n for n in names if n not in BY_VERSION]
    if unknown:
        sys.exit(f"unknown release(s) {', '.join(unknown)}; known: {', '.join(BY_VERSION)}")
    releases = [BY_VERSION[n] for n in names] if names else list(RELEASES)
    own = [r for r in releases if r.vllm != DEFAULT_RELEASE]  # the default one is .venv (setup_env.sh)
    VENVS.mkdir(parents=True, exist_ok=True)
    ensure_uv()
    for release in own:
        build_release(release)
    install_guard(own)
    print(f"release venvs ready under {VENVS.relative_to(ROOT)}; free disk: {disk_free(WORK)}", flush=True)


def disk_free(path: Path) -> str:
    return f"{shutil.disk_usage(path).free / 2**30:.1f} GiB"


if __name__ == "__main__":
    main(sys.argv[1:])
