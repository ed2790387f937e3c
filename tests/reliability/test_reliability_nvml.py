"""A missing, failing or hanging NVML: the guard does not ask NVML (the GPUs come from the kernel module's
files, docs/design.md §2.8), so its record is the same as with a working NVML and it never waits on one;
vLLM's own platform detection meets the fault exactly as without the guard.

The method (each fault against the same vLLM start-up with the guard off): tests/faultkit.py."""

from __future__ import annotations

import time
from pathlib import Path

from faultkit import MODES, RESOLVE, Child, assert_strict_goes_on, run_modes


def _same_record_as_with_nvml(runs) -> str:  # type: ignore[no-untyped-def]
    line = runs["guard"].line()
    assert "INFO" in line and "overlay loaded" in line and "NVML" not in line
    record = runs["guard"].last_record()
    assert record["problems"] == [] and record["gpu"]["source"] == "procfs"
    assert record["gpu"]["gpus"][0]["name"] == "NVIDIA GeForce RTX 4090"
    return line


def test_nvml_missing(pods, tmp_path: Path) -> None:
    """No libnvidia-ml.so.1 at all. vLLM's platform detection finds no CUDA in both runs (the overlay is
    loaded all the same: harmless, nothing imports the extension)."""
    pod = pods("vcuda", nvml_is_layer=False)
    (pod.lib_dir / "libnvidia-ml.so.1").unlink()
    runs = run_modes(pod, tmp_path, strict_alone=True)
    assert runs["off"].outcome == runs["guard"].outcome == {"platform": "UnspecifiedPlatform"}
    _same_record_as_with_nvml(runs)
    assert_strict_goes_on(runs["strict"], runs["guard"])  # nothing for strict mode to stop on


def test_nvml_erroring(pods, tmp_path: Path) -> None:
    """nvmlInit fails (NVML_ERROR_UNKNOWN, as a broken driver install answers)."""
    pod = pods("vcuda", nvml_is_layer=False)
    runs = run_modes(pod, tmp_path, {"STANDIN_NVML_FAIL": "999"}, strict_alone=True)
    assert runs["off"].outcome == runs["guard"].outcome == {"platform": "UnspecifiedPlatform"}
    _same_record_as_with_nvml(runs)
    assert_strict_goes_on(runs["strict"], runs["guard"])


NVML_HANGS = "standin-nvml: nvmlInit hangs"  # what the stand-in says as it blocks (tests/csrc/standin_nvml.c)


def blocked_in_nvml(child: Child, within: float) -> bool:
    """Whether `child` reaches the stand-in's hanging nvmlInit (within `within` seconds: vLLM's import) and
    stays there: alive, asleep, its main thread in the stand-in's nanosleep. Proven by the process's state,
    not by waiting out a timeout."""
    deadline = time.monotonic() + within
    while NVML_HANGS not in child.err.read_text():
        if child.process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    pid = child.process.pid
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    waiting_in = Path(f"/proc/{pid}/wchan").read_text()
    return child.process.poll() is None and state == "S" and "nanosleep" in waiting_in


def test_nvml_hanging(pods, tmp_path: Path) -> None:
    """nvmlInit never returns. vLLM asks NVML itself while resolving its platform, unbounded, so without the
    guard the process hangs there; `import vllm` alone does not ask NVML and returns. With the guard the
    same: `import vllm` returns with the guard's record line written before it, then the process blocks in
    vLLM's own call, exactly where it blocks without the guard."""
    pod = pods("vcuda", nvml_is_layer=False)
    children = {
        mode: Child(pod, RESOLVE, tmp_path / mode, {"STANDIN_NVML_HANG": "1", **MODES[mode]})
        for mode in ("off", "guard")
    }
    blocked = {mode: blocked_in_nvml(child, within=180) for mode, child in children.items()}
    runs = {mode: child.collect(0) for mode, child in children.items()}  # killed now: they would not return
    assert blocked == {"off": True, "guard": True}, {m: r.stdout + r.stderr for m, r in runs.items()}
    for mode in ("off", "guard"):
        assert "IMPORTED" in runs[mode].stdout and runs[mode].outcome is None
    assert runs["off"].guard_lines() == []
    line = runs["guard"].line()
    assert runs["guard"].stdout.index(line) < runs["guard"].stdout.index("IMPORTED")
