"""A missing, failing or hanging NVML.

The method (each fault against the same vLLM start-up with the guard off): tests/faultkit.py."""

from __future__ import annotations

from pathlib import Path

from faultkit import RESOLVE, assert_as_without, assert_strict_stops, run_modes


def test_nvml_missing(pods, tmp_path: Path) -> None:
    """No libnvidia-ml.so.1 at all. vLLM's platform detection finds no CUDA in both runs (the guard still
    loaded the overlay before asking NVML: harmless, nothing imports the extension)."""
    pod = pods("vcuda")
    (pod.lib_dir / "libnvidia-ml.so.1").unlink()
    runs = run_modes(pod, tmp_path)
    assert runs["off"].outcome == {"platform": "UnspecifiedPlatform"}
    line = assert_as_without(
        runs, "NVML unavailable: libnvidia-ml.so.1: cannot open shared object file", "the GPUs are unknown"
    )
    assert "WARNING" in line
    assert_strict_stops(runs["strict"], "NVML unavailable: libnvidia-ml.so.1")


def test_nvml_erroring(pods, tmp_path: Path) -> None:
    """nvmlInit fails (NVML_ERROR_UNKNOWN, as a broken driver install answers)."""
    runs = run_modes(pods("vcuda"), tmp_path, {"STANDIN_NVML_FAIL": "999"})
    assert runs["off"].outcome == {"platform": "UnspecifiedPlatform"}
    assert_as_without(runs, "NVML unavailable: nvmlInit_v2: Unknown Error (999)")
    assert_strict_stops(runs["strict"], "nvmlInit_v2: Unknown Error (999)")


def test_nvml_hanging(pods, tmp_path: Path) -> None:
    """nvmlInit never returns. vLLM asks NVML itself while resolving its platform, unbounded, so without
    the guard the process hangs there; `import vllm` alone does not ask NVML and returns. "As without the
    guard" is therefore: `import vllm` returns (the guard's own NVML query is bounded, NVML_TIMEOUT_S; here
    shortened to 2 s) and the process then hangs in vLLM's own call, exactly where it hangs without the
    guard; the record line says NVML did not answer. Strict mode does better than hanging: it stops start-up
    with that cause once the guard's query times out."""
    code = "import vllm_tmaguard.guard as guard\nguard.NVML_TIMEOUT_S = 2.0\n" + RESOLVE
    runs = run_modes(pods("vcuda"), tmp_path, {"STANDIN_NVML_HANG": "1"}, code=code, timeout=30)
    for mode in ("off", "guard"):
        assert runs[mode].returncode is None, f"{mode}: expected a hang\n{runs[mode].stdout}"
        assert "IMPORTED" in runs[mode].stdout and runs[mode].outcome is None
    assert runs["off"].guard_lines() == []
    line = runs["guard"].line()
    assert "NVML did not answer within 2 s" in line and "WARNING" in line
    assert runs["guard"].stdout.index(line) < runs["guard"].stdout.index("IMPORTED")
    assert_strict_stops(runs["strict"], "NVML did not answer within 2 s")
