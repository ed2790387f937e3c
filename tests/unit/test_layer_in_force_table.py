"""Issue 32 items 3 and 6, the pure steps as tables: whether a preloaded layer is in force (preloads.py:
each entry judged from its file and from whether this process's loader mapped it), the layer's conditions
(layers.py), the problems they are (metering.layer_problems), the record's outcome and summary, the metric's
labels, the record's `layer_files` and its shape; the ELF reader's version needs checked against binutils."""

from __future__ import annotations

import errno
import subprocess

import pytest
from facts_kit import REAL_DRIVER, driver, facts

from vllm_tmaguard import codes
from vllm_tmaguard.doctor.record_shape import why_not_a_record
from vllm_tmaguard.metrics import info_labels
from vllm_tmaguard.stages import preloads
from vllm_tmaguard.stages.elf import (
    EM_AARCH64,
    EM_X86_64,
    NOT_ELF,
    OPEN_FAILED,
    REFUSED,
    ElfError,
    ElfInfo,
    read_elf,
)
from vllm_tmaguard.stages.gpu import GpuFacts
from vllm_tmaguard.stages.layers import Layer, PodEvidence, detect_layers
from vllm_tmaguard.stages.metering import layer_problems, metering_json
from vllm_tmaguard.stages.outcomes import Problem
from vllm_tmaguard.stages.preloads import PreloadFault, judge_preload
from vllm_tmaguard.stages.record import assemble, outcome_of
from vllm_tmaguard.stages.supply import plan_supply
from vllm_tmaguard.stages.toggles import Toggles

HAMI = "/usr/local/vgpu/libvgpu.so"
VGPU = "/etc/vgpu-manager/driver/libvgpu-control.so"
NVSHARE = "/usr/lib/nvshare/libnvshare.so"
GLIBC = (2, 36)


def elf(machine: int = EM_X86_64, elf_class: int = 2, needs=(), path: str = HAMI) -> ElfInfo:
    defined = frozenset({"dlsym", "cuLaunchKernelEx", "ensure_post_init"})
    return ElfInfo(path, machine, None, (), defined, frozenset(), elf_class, tuple(needs))


def error(kind: str, why: str, number: int | None = None) -> ElfError:
    return ElfError(HAMI, why, number, kind)


# name -> (what was read, mapped by this process's loader, expected (kind, found) or None)
JUDGED = {
    "mapped: in force whatever the file": (error(OPEN_FAILED, "No such file", errno.ENOENT), True, None),
    "a good file, another root's preload file (not asked)": (elf(), None, None),
    "missing (the loader: cannot open shared object file)": (
        error(OPEN_FAILED, "No such file or directory", errno.ENOENT), False,
        (preloads.MISSING, "No such file or directory"),
    ),
    "missing, judged by its file alone": (
        error(OPEN_FAILED, "No such file or directory", errno.ENOENT), None,
        (preloads.MISSING, "No such file or directory"),
    ),
    "unreadable": (
        error(OPEN_FAILED, "Permission denied", errno.EACCES), False,
        (preloads.UNREADABLE, "Permission denied"),
    ),
    "a directory (HAMi #777: cannot read file data)": (
        error(REFUSED, "is a directory, not a regular file", errno.EPERM), False,
        (preloads.NOT_A_FILE, "is a directory, not a regular file"),
    ),
    "not ELF": (
        error(NOT_ELF, "not an ELF file (bad magic)"), False,
        (preloads.NOT_AN_ELF, "not an ELF file (bad magic)"),
    ),
    "a 32-bit build": (elf(machine=3, elf_class=1), False, (preloads.WRONG_CLASS, "ELFCLASS32")),
    "an aarch64 build": (elf(machine=EM_AARCH64), False, (preloads.WRONG_MACHINE, "built for ARM aarch64")),
    "needs a newer glibc": (
        elf(needs=[("libc.so.6", "GLIBC_2.2.5"), ("libm.so.6", "GLIBC_2.38"), ("libc.so.6", "GLIBC_PRIV")]),
        None, (preloads.NEEDS_NEWER_GLIBC, "GLIBC_2.38, newer than this glibc 2.36"),
    ),
    "needs what this glibc has": (elf(needs=[("libc.so.6", "GLIBC_2.34")]), None, None),
    "a good file this process's loader did not map": (
        elf(), False, (preloads.NOT_LOADED, "not among the objects this process's loader mapped"),
    ),
    "a file the reader cannot make sense of, the loader may load": (
        error("malformed", "no usable section header table"), None, None,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", JUDGED)
def test_each_entry_judged(name: str) -> None:
    read, mapped, expected = JUDGED[name]
    fault = judge_preload(HAMI, "LD_PRELOAD", read, mapped, EM_X86_64, GLIBC)
    assert (fault and (fault.kind, fault.found)) == expected
    assert fault is None or (fault.entry, fault.source) == (HAMI, "LD_PRELOAD")


NVIDIA = ElfInfo("/usr/lib/libcuda.so.1", EM_X86_64, "libcuda.so.1", (), REAL_DRIVER, frozenset())


def pod(preload=(), faults=None, environ=None, paths=()) -> PodEvidence:
    return PodEvidence(frozenset(paths), tuple(preload), environ or {}, NVIDIA, {}, {}, (), faults or {})


def fault(entry: str, kind: str = preloads.MISSING, source: str = "LD_PRELOAD") -> PreloadFault:
    return PreloadFault(entry, source, kind, "No such file or directory")


LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT_0": "8g"}
GLIBC_FAULT = PreloadFault(HAMI, "/etc/ld.so.preload", preloads.NEEDS_NEWER_GLIBC, "GLIBC_2.38", "GLIBC_2.38")
# name -> (evidence, [(layer, conditions)])
LAYERS = {
    "HAMi-core preloaded and loaded": (pod([HAMI], environ=LIMIT), [("hami", ())]),
    "HAMi-core's only entry missing (LD_PRELOAD naming no file)": (
        pod([HAMI], {HAMI: fault(HAMI)}, LIMIT), [("hami", (preloads.NOT_IN_FORCE,))],
    ),
    "HAMi-core: one of two entries missing, the other loaded": (
        pod(["/elsewhere/libvgpu.so", HAMI], {HAMI: fault(HAMI)}, LIMIT), [("hami", ())],
    ),
    "HAMi-core: both entries skipped": (
        pod(["/a/libvgpu.so", HAMI], {"/a/libvgpu.so": fault("/a/libvgpu.so"), HAMI: fault(HAMI)}, LIMIT),
        [("hami", (preloads.NOT_IN_FORCE,))],
    ),
    "HAMi-core needing a newer glibc: every process dies": (
        pod([HAMI], {HAMI: GLIBC_FAULT}, LIMIT), [("hami", (preloads.PRELOAD_NEEDS_GLIBC,))],
    ),
    "HAMi's limits and mounted library, nothing preloading it": (
        pod(environ=LIMIT, paths=[HAMI, "/usr/local/vgpu"]), [("hami", (preloads.NOT_PRELOADED,))],
    ),
    "HAMi's limits with CUDA_DISABLE_CONTROL=true (its plugin leaves the preload out)": (
        pod(environ={**LIMIT, "CUDA_DISABLE_CONTROL": "true"}, paths=[HAMI]),
        [("hami", (preloads.NOT_PRELOADED, preloads.CONTROL_DISABLED))],
    ),
    "CUDA_DISABLE_CONTROL=false is no switch (Go's ParseBool)": (
        pod(environ={**LIMIT, "CUDA_DISABLE_CONTROL": "false"}), [],
    ),
    "HAMi's limits alone (no library, no switch): nothing named": (pod(environ=LIMIT), []),
    "vgpu-manager's entry of another machine": (
        pod([VGPU], {VGPU: fault(VGPU, preloads.WRONG_MACHINE)}),
        [("vgpu-manager", (preloads.NOT_IN_FORCE,))],
    ),
    "vgpu-manager oversold and not in force: the caveat is moot": (
        pod([VGPU], {VGPU: fault(VGPU)}, {"CUDA_MEM_RATIO": "1.5"}),
        [("vgpu-manager", (preloads.NOT_IN_FORCE,))],
    ),
    "nvshare not in force: its socket is never asked for": (
        pod([NVSHARE], {NVSHARE: fault(NVSHARE, preloads.NOT_A_FILE)}),
        [("nvshare", (preloads.NOT_IN_FORCE,))],
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", LAYERS)
def test_layer_conditions(name: str) -> None:
    evidence, expected = LAYERS[name]
    assert [(layer.name, layer.conditions) for layer in detect_layers(evidence, 13000)] == expected


def _problems(name: str) -> tuple[Problem, ...]:
    return layer_problems(detect_layers(LAYERS[name][0], 13000))


def test_not_in_force_is_a_problem_naming_the_entry_the_file_and_why() -> None:
    (problem,) = _problems("HAMi-core's only entry missing (LD_PRELOAD naming no file)")
    assert problem.code == codes.LAYER_NOT_IN_FORCE and problem.subject == HAMI
    assert problem.cause == f"HAMi-core's limits are NOT in force: {HAMI} (from LD_PRELOAD) is not there"
    loader = f"`ERROR: ld.so: object '{HAMI}' from LD_PRELOAD cannot be preloaded (cannot open shared object"
    assert loader in problem.consequence
    assert problem.fix.startswith(f"mount HAMi-core's library at {HAMI}")
    (wrong,) = _problems("vgpu-manager's entry of another machine")
    assert wrong.fix.startswith("mount the build of vgpu-manager's library for this machine")


def test_the_switch_and_the_missing_preload_are_problems_with_their_fixes() -> None:
    switch = "HAMi's limits with CUDA_DISABLE_CONTROL=true (its plugin leaves the preload out)"
    (switched,) = _problems(switch)
    assert switched.code == codes.LAYER_NOT_IN_FORCE and switched.subject == "CUDA_DISABLE_CONTROL"
    assert "CUDA_DISABLE_CONTROL=true" in switched.cause
    assert switched.fix.startswith("unset CUDA_DISABLE_CONTROL")
    (bare,) = _problems("HAMi's limits and mounted library, nothing preloading it")
    assert bare.subject == HAMI and "nothing preloads" in bare.cause and "/etc/ld.so.preload" in bare.fix


def test_a_newer_glibc_is_a_layer_that_cannot_load() -> None:
    (problem,) = _problems("HAMi-core needing a newer glibc: every process dies")
    assert problem.code == codes.LAYER_CANNOT_LOAD and problem.code in codes.CUDA_BROKEN
    assert "`version `GLIBC_2.38' not found (required by /usr/local/vgpu/libvgpu.so)`" in problem.consequence


def test_a_layer_not_in_force_meters_nothing() -> None:
    layer = Layer("hami", ("x",), family="8f3a89c", conditions=(preloads.NOT_IN_FORCE,))
    assert metering_json((layer,)) == [] and metering_json((layer._replace(conditions=()),))


def _record(problems: list[dict], layer_files: list[dict] | None = None) -> dict:
    return {
        "tmaguard": "0.1.0", "mode": "auto", "outcome": "degraded", "tma": None, "routing": None,
        "layers": [{"name": "hami", "label": "HAMi-core", "evidence": ["x"]}], "problems": problems,
        "vllm": {"version": "0.32.0"}, "layer_files": layer_files or [],
    }  # fmt: skip


def test_the_metric_says_the_quota_is_not_in_force_and_which_build() -> None:
    off = info_labels(_record([{"code": codes.LAYER_NOT_IN_FORCE}]))
    assert (off["layer_in_force"], off["layer_sha256"]) == ("false", "none")
    library = {"layer": "hami", "path": HAMI, "size": 1, "sha256": "0123456789ab"}
    on = info_labels(_record([], [library]))
    assert (on["layer_in_force"], on["layer_sha256"]) == ("true", "0123456789ab")
    assert info_labels({**_record([]), "layers": []})["layer_in_force"] == "none"


def test_the_outcome_is_degraded_and_the_summary_says_it_first() -> None:
    """CUDA still works (nothing in codes.CUDA_BROKEN), but the record must not read healthy."""
    layers = detect_layers(LAYERS["HAMi-core's only entry missing (LD_PRELOAD naming no file)"][0], 13000)
    seen, problems = facts(driver(REAL_DRIVER), layers), layer_problems(layers)
    plan = plan_supply(seen, Toggles())
    assert plan.lacking == () and codes.LAYER_NOT_IN_FORCE not in codes.CUDA_BROKEN
    assert outcome_of(seen, GpuFacts(), plan, problems, True) == codes.DEGRADED
    assert outcome_of(seen, GpuFacts(), plan, (), True) == codes.COMPLETE
    record = assemble("test", "auto", seen, GpuFacts(), plan, None, (), problems, {})
    assert record.summary == "HAMi-core: configured but NOT in force (not loaded): no quota, no limit"


def test_the_records_layer_files_are_read_back_where_present() -> None:
    assert why_not_a_record({**_valid_record(), "layer_files": [{"layer": "hami"}]}).startswith(
        "has a field 'layer_files' of the wrong shape"
    )
    good = {"layer": "hami", "path": HAMI, "size": 10, "sha256": None, "build_id": None, "versions": []}
    assert why_not_a_record({**_valid_record(), "layer_files": [good]}) is None
    assert why_not_a_record(_valid_record()) is None  # a record of an earlier release has none


def _valid_record() -> dict:
    return {
        "schema": 2, "tmaguard": "0.1.0", "pid": 1, "time": "t", "trigger": "t", "mode": "auto",
        "outcome": "degraded", "summary": "s", "layers": [], "libcuda": {"path": None, "how": "not found"},
        "gpu": {"gpus": []}, "vllm": {}, "lacking": [], "missing": {}, "supplied": {}, "encoder": None,
        "tma": None, "routing": None, "actions": [], "problems": [], "elapsed_ms": 0.0, "record_file": None,
        "forked_from": None, "replayed_from": None,
    }  # fmt: skip


def _readelf_needs(path: str) -> list[tuple[str, str]]:
    out = subprocess.run(
        ["readelf", "-V", "-W", path], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    found, file = [], None
    for line in out.split("Version needs section", 1)[-1].splitlines():
        if "File:" in line:
            file = line.split("File:")[1].split()[0]
        elif "Name:" in line and file:
            found.append((file, line.split("Name:")[1].split()[0]))
    return found


@pytest.mark.parametrize("path", ["/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libstdc++.so.6"])
def test_version_needs_match_readelf(path: str) -> None:
    info = read_elf(path, prefixes=(), versions=True)
    assert sorted(info.needs_versions) == sorted(_readelf_needs(path)) and info.needs_versions
    assert read_elf(path, prefixes=()).needs_versions == ()  # read only where asked
