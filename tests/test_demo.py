"""README command 1 after the environment build (scripts/demo.py): a screen that shows vLLM failing on the
emulated vCUDA pod, the guard's line, vLLM starting, and where the full record and the doctor are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from podkit import GUARD_LINE_LIMIT, guard_lines, scrubbed_environ

REPO = Path(__file__).resolve().parent.parent
SCREEN = 25  # lines, together with the environment build's lines when it is up to date (two)


def demo(build: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """scripts/demo.py with its pod and records in `build` (not the user's build/demo)."""
    env = {**scrubbed_environ(), "COLUMNS": "100"}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py"), "--build", str(build), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )


def test_the_demo_fits_a_screen_and_says_where_the_record_and_the_doctor_are(tmp_path: Path) -> None:
    done = demo(tmp_path / "demo")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) + 2 <= SCREEN, done.stdout
    without, with_guard = done.stdout.split("2. vLLM 0.32.0 with the guard", 1)
    assert "ImportError: " in without and "undefined symbol: cuTensorMapEncodeTiled" in without
    (line,) = guard_lines("\n".join(line.strip() for line in with_guard.splitlines()))
    assert len(line) <= GUARD_LINE_LIMIT and "overlay loaded" in line
    assert "vLLM started its CUDA platform: NvmlCudaPlatform" in with_guard
    record = next(line for line in lines if line.startswith("The guard's full record: ")).split(": ", 1)[1]
    assert record == str(tmp_path / "demo" / "records" / "last.json")
    assert json.loads(Path(record).read_text())["supplied"]["cuTensorMapEncodeTiled"] == "overlay"
    assert lines[-1] == f"The doctor on this pod:  bash scripts/demo.sh --build {tmp_path / 'demo'} doctor"

    doctor = demo(tmp_path / "demo", "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "Last record" in doctor.stdout and "none at" not in doctor.stdout  # it read the demo's record
    assert doctor.stdout.splitlines()[-1].startswith("healthy (exit 0)")
