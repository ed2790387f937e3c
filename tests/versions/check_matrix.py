"""The version matrix: the guard with each vLLM release's real wheel (its extensions, platform code and kernel
selectors) on emulated pods. Run by scripts/test_versions.sh (not collected by the default test run: it
needs the release venvs tests/versions/build_envs.py builds). TMAGUARD_RELEASES=0.8.5,0.33.0 narrows it.

Each test fills one cell of docs/compat.md (a release x a pod); a cell is written whether it passes or not."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from podkit import Pod, child_environ
from releases import BY_VERSION, RELEASES, RESULTS, Release

from vllm_tmaguard.stages.routing_table import KERNELS, table_for

PROBE = Path(__file__).with_name("probe.py")
RTX4090 = {"gpu_name": "NVIDIA GeForce RTX 4090", "cc": "8.9"}
H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "cc": "9.0"}
RTX5070 = {"gpu_name": "NVIDIA GeForce RTX 5070", "cc": "12.0"}
# column -> (pod kind, GPU): the guarded cells
GUARDED = {
    "8.9 vCUDA": ("vcuda", RTX4090),
    "9.0 vCUDA, encoder forwarded": ("vcuda", H100),
    "9.0 lupine, no encoder": ("lupine", H100),
    "12.0 vCUDA": ("vcuda", RTX5070),
}
TMA_ON_HOPPER = {name for name, kernel in KERNELS.items() if 9 in kernel.tma_majors}
# The path routing.py names for the mixed-precision family -> the class vLLM's selector must return.
MIXED_PATH_CLASS = {
    "Marlin (cp.async)": "MarlinLinearKernel",
    "vLLM's choice: Machete (sm_90 TMA)": "MacheteLinearKernel",
    "vLLM's choice: Humming (sm_90 TMA)": "HummingLinearKernel",
}
ATTENTION_PATH_FA = {"FlashAttention-2": 2, "vLLM's choice: FlashAttention-3": 3}

selected = os.environ.get("TMAGUARD_RELEASES")
MATRIX = [BY_VERSION[v] for v in selected.split(",")] if selected else list(RELEASES)
CELLS: dict[str, dict[str, dict]] = {}


def record_cell(release: Release, column: str, text: str, check: Callable[[], None], **data: object) -> None:
    cell = {"ok": False, "text": text, **data}
    CELLS.setdefault(release.vllm, {})[column] = cell
    try:
        check()
    except AssertionError as error:
        cell["why"] = str(error).split("\n")[0][:400]
        raise
    else:
        cell["ok"] = True
    finally:
        save(release)


def save(release: Release) -> None:
    """The release's cells so far, in its own file, over the cells earlier runs left there."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{release.vllm}.json"
    earlier = json.loads(path.read_text())["cells"] if path.exists() else {}
    path.write_text(json.dumps({"vllm": release.vllm, "cells": {**earlier, **CELLS[release.vllm]}}, indent=1))


class Child:
    def __init__(self, done: subprocess.CompletedProcess, record_dir: Path, site: Path) -> None:
        self.returncode, self.stdout, self.stderr = done.returncode, done.stdout, done.stderr
        self.record_dir, self.site = record_dir, site

    @property
    def result(self) -> dict:
        lines = [line for line in self.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, f"no RESULT line\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"
        return json.loads(lines[-1].removeprefix("RESULT "))

    def record(self) -> dict:
        """The probe process's own record (helpers it starts, such as Humming's, write theirs too)."""
        return json.loads((self.record_dir / f"process-{self.result['pid']}.json").read_text())

    def portable(self, text: str) -> str:
        """`text` with this machine's venv path replaced, as docs/compat.md shows it."""
        return text.replace(str(self.site), "site-packages")


@pytest.fixture
def run_release(tmp_path: Path) -> Callable[..., Child]:
    counter = iter(range(1000))

    def run(release: Release, pod: Pod, *args: str, env: dict | None = None, module: bool = False) -> Child:
        assert release.python.exists(), f"{release.python} missing: run scripts/test_versions.sh"
        record_dir = tmp_path / f"records-{next(counter)}"
        command = [str(release.python), *(["-m", *args] if module else [str(PROBE), *args])]
        done = subprocess.run(
            command,
            env=child_environ(pod, record_dir, env),
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        site = next(release.venv.glob("lib/python3*/site-packages"))
        return Child(done, record_dir, site)

    return run


def families(record: dict) -> dict[str, str]:
    return {f["family"]: f["path"] for f in record["routing"]["families"]}


@pytest.mark.parametrize("release", MATRIX, ids=lambda r: r.vllm)
def test_guard_off_the_release_fails_with_its_own_error(release: Release, pods, run_release) -> None:
    child = run_release(release, pods("vcuda", **RTX4090), "selectors", env={"TMAGUARD_MODE": "off"})
    error = child.portable(child.result.get("error", ""))

    def check() -> None:
        match = re.fullmatch(r"ImportError: site-packages/(vllm/\S+\.so): undefined symbol: (cu\w+)", error)
        assert match, f"not the undefined-symbol import error: {error!r}"
        assert match.group(2) in ("cuTensorMapEncodeTiled", "cuGetProcAddress_v2"), error
        assert not (child.record_dir / "last.json").exists()  # the guard stayed out

    record_cell(release, "guard off (8.9 vCUDA)", error, check)


@pytest.mark.parametrize("column", GUARDED)
@pytest.mark.parametrize("release", MATRIX, ids=lambda r: r.vllm)
def test_guard_on_platform_ops_and_selectors_follow_the_routing(
    release: Release, column: str, pods, run_release
) -> None:
    kind, gpu = GUARDED[column]
    child = run_release(release, pods(kind, **gpu), "selectors")
    result = child.result
    text = summary(result)

    def check() -> None:
        assert "error" not in result, f"{result['error']} | {child.stderr[-1500:]}"
        assert result["platform"] in ("NvmlCudaPlatform", "CudaPlatform"), result["platform"]
        assert {"_C::machete_mm", "_C::gptq_marlin_repack"} <= set(result["ops"]), "vLLM's ops not registered"
        record = child.record()
        routing = record["routing"]
        assert routing["stale"] == [], routing["stale"]
        assert record["unfixed"] == [], record["unfixed"]
        # the vllm.platform_plugins group exists from 0.8 (in platforms/__init__.py until 0.10)
        assert record["vllm"]["platform_plugins"] is (release is not RELEASES[0]), record["vllm"]
        if release is RELEASES[0]:  # 0.6 imports its extension before any plugin of its runs: the .pth hook
            assert record["trigger"] == "import-hook", record["trigger"]
        route = families(record)
        disabled = {d["kernel"] for d in routing["disabled_kernels"]}
        chosen = {result["w4a16"], result["fp8"], result["fp8_block"]}
        assert chosen.isdisjoint(disabled), f"vLLM chose a kernel the guard disabled: {chosen & disabled}"
        assert MIXED_PATH_CLASS[route["mixed-precision linear"]] == result["w4a16"], (
            f"routing says {route['mixed-precision linear']!r}, vLLM chose {result['w4a16']}"
        )
        expected_fa = ATTENTION_PATH_FA[route["attention"]] if result["fa"] is not None else None
        assert result["fa"] == expected_fa, (
            f"routing says {route['attention']!r}, vLLM chose FA{result['fa']}"
        )
        if kind == "lupine":  # no reachable encoder: nothing vLLM picked may be a TMA kernel
            assert record["tma"]["usable"] is False
            assert chosen.isdisjoint(TMA_ON_HOPPER) and result["fa"] != 3, chosen
            assert result.get("fa3_available") in (None, False)  # the guard kept FA3 from importing
            if {result["fp8"], result["fp8_block"]} & {"cutlass_scaled_mm", "cutlass_scaled_mm (block)"}:
                # CUTLASS sm90 where no knob reaches it: the record must say so
                assert any("FP8" in hint for hint in routing["hints"]), routing["hints"]
            for variable, value in routing["env"].items():
                assert result["env"].get(variable) == value, f"{variable} not set in the vLLM process"
        if column.startswith("9.0 vCUDA"):
            assert record["tma"]["usable"] is True and routing["env"] == {}, routing["env"]

    missing = child.record()["missing"] if (child.record_dir / "last.json").exists() else None
    record_cell(release, column, text, check, missing=missing)


def summary(result: dict) -> str:
    if "error" in result:
        return result["error"]
    short = {
        "MarlinLinearKernel": "Marlin",
        "MacheteLinearKernel": "Machete",
        "HummingLinearKernel": "Humming",
    }
    parts = [f"W4A16 {short.get(result['w4a16'], result['w4a16'])}", f"FP8 {result['fp8']}"]
    if result["fp8_block"]:
        parts.append(f"block FP8 {result['fp8_block']}")
    parts.append(f"FA{result['fa']}" if result["fa"] else "FA2 only (no FA3 in this release)")
    return ", ".join(parts)


@pytest.mark.parametrize("release", MATRIX, ids=lambda r: r.vllm)
def test_vllm_alone_on_12_0_shows_whether_it_gates_sm90a_kernels(release: Release, pods, run_release) -> None:
    """The table's `gated_to_90`: without the guard, does the release keep Machete off compute capability
    12.0 by itself? (A complete driver, so the release imports without the guard.)"""
    child = run_release(release, pods("bare", **RTX5070), "selectors", env={"TMAGUARD_MODE": "off"})
    result = child.result
    table, _ = table_for(release.vllm)

    def check() -> None:
        assert "error" not in result, result.get("error")
        expected = "MarlinLinearKernel" if table.gated_to_90 else "MacheteLinearKernel"
        assert result["w4a16"] == expected, (
            f"gated_to_90={table.gated_to_90} but vLLM chose {result['w4a16']}"
        )

    record_cell(release, "12.0, vLLM alone", f"W4A16 {result.get('w4a16', result.get('error'))}", check)


@pytest.mark.parametrize("release", MATRIX, ids=lambda r: r.vllm)
def test_doctor_names_the_cause_and_the_fix(release: Release, pods, run_release) -> None:
    pod = pods("vcuda", **RTX4090)
    off = run_release(
        release, pod, "vllm_tmaguard", "doctor", "--json", env={"TMAGUARD_MODE": "off"}, module=True
    )
    on = run_release(release, pod, "vllm_tmaguard", "doctor", "--json", module=True)
    report_off, report_on = json.loads(off.stdout), json.loads(on.stdout)
    causes = {f["subject"]: f for f in report_off["findings"] if f["id"] == "gap-guard-off"}
    encoder = causes.get("cuTensorMapEncodeTiled", {"detail": "no finding for cuTensorMapEncodeTiled"})
    text = f"guard off: {encoder['detail']} Fix: {report_off['fix']['env']}"

    def check() -> None:
        assert report_off["vllm"]["version"] == release.vllm and off.returncode == 1
        assert "vLLM fails to import it" in encoder["detail"], encoder["detail"]
        imported = report_off["vllm"]["imported_at_platform_load"]
        assert imported and all(module in encoder["detail"] for module in imported), (imported, encoder)
        assert report_off["fix"]["env"] == {"TMAGUARD_MODE": "auto"}, report_off["fix"]
        supplied = {f["subject"] for f in report_on["findings"] if f["id"] == "gap-supplied"}
        assert "cuTensorMapEncodeTiled" in supplied and on.returncode == 0, report_on["findings"]

    record_cell(release, "doctor", text, check)


@pytest.mark.parametrize("release", MATRIX, ids=lambda r: r.vllm)
def test_routing_table_names_exist_in_the_release(release: Release, pods, run_release) -> None:
    """Every name the release's routing table uses is a class, knob, module or flag of that release, and the
    release has no DeepGEMM knob, FA3/FlashMLA extension or known TMA class the table leaves out."""
    table, note = table_for(release.vllm)
    fa3, flashmla = "vllm.vllm_flash_attn._vllm_fa3_C", "vllm._flashmla_C"
    flags = sorted({flag for hint in table.no_knob for flag in re.findall(r"--[a-z][a-z-]+", hint)})
    request = {"listed_in": table.listed_in, "modules": [fa3, flashmla], "flags": flags}
    child = run_release(release, pods("bare", **H100), "tables", json.dumps(request))
    found = child.result

    def check() -> None:
        assert note is None, note
        assert "error" not in found, found.get("error")
        classes, knobs, modules = set(found["classes"]), set(found["knobs"]), found["modules"]
        assert set(table.kernels) <= classes, f"not in {table.listed_in}: {set(table.kernels) - classes}"
        assert not (set(KERNELS) & classes) - set(table.kernels), (
            f"TMA classes the table leaves out: {(set(KERNELS) & classes) - set(table.kernels)}"
        )
        deep_gemm = {"VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM"} & knobs
        assert set(table.deep_gemm_off) == deep_gemm, (
            f"DeepGEMM knobs: table {table.deep_gemm_off}, vLLM {deep_gemm}"
        )
        has_fa_env = "VLLM_FLASH_ATTN_VERSION" in knobs
        assert (table.flash_attn_env is not None) == has_fa_env, (
            f"VLLM_FLASH_ATTN_VERSION in envs: {has_fa_env}"
        )
        assert (table.fa3_module == fa3) == modules[fa3], f"{fa3} in the wheel: {modules[fa3]}"
        assert (table.flashmla_module == flashmla) == modules[flashmla], f"{flashmla}: {modules[flashmla]}"
        assert found["flags"] == dict.fromkeys(flags, True), f"CLI flags the hints name: {found['flags']}"

    text = f"table {table.since}: {len(table.kernels)} classes, knobs {', '.join(table.deep_gemm_off) or '-'}"
    record_cell(release, "routing table", text, check)
