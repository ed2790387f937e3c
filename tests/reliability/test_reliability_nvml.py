"""A missing, failing or hanging NVML: the guard does not ask NVML (the GPUs come from the kernel module's
files, docs/design.md §2.8), so its record is the same as with a working NVML and it never waits on one;
vLLM's own platform detection meets the fault exactly as without the guard.

The method (each fault against the same vLLM start-up with the guard off): tests/faultkit.py."""

from __future__ import annotations

from pathlib import Path

from faultkit import RESOLVE, run_modes


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
    runs = run_modes(pod, tmp_path)
    assert runs["off"].outcome == runs["guard"].outcome == {"platform": "UnspecifiedPlatform"}
    _same_record_as_with_nvml(runs)
    assert runs["strict"].outcome == runs["off"].outcome  # nothing for strict mode to stop on


def test_nvml_erroring(pods, tmp_path: Path) -> None:
    """nvmlInit fails (NVML_ERROR_UNKNOWN, as a broken driver install answers)."""
    runs = run_modes(pods("vcuda", nvml_is_layer=False), tmp_path, {"STANDIN_NVML_FAIL": "999"})
    assert runs["off"].outcome == runs["guard"].outcome == {"platform": "UnspecifiedPlatform"}
    _same_record_as_with_nvml(runs)


def test_nvml_hanging(pods, tmp_path: Path) -> None:
    """nvmlInit never returns. vLLM asks NVML itself while resolving its platform, unbounded, so without the
    guard the process hangs there; `import vllm` alone does not ask NVML and returns. With the guard the
    same: `import vllm` returns with the guard's record line written before it, then the process hangs in
    vLLM's own call, exactly where it hangs without the guard."""
    runs = run_modes(
        pods("vcuda", nvml_is_layer=False), tmp_path, {"STANDIN_NVML_HANG": "1"}, code=RESOLVE, timeout=30
    )
    for mode in ("off", "guard"):
        assert runs[mode].returncode is None, f"{mode}: expected a hang\n{runs[mode].stdout}"
        assert "IMPORTED" in runs[mode].stdout and runs[mode].outcome is None
    assert runs["off"].guard_lines() == []
    line = runs["guard"].line()
    assert runs["guard"].stdout.index(line) < runs["guard"].stdout.index("IMPORTED")
