"""Issue 26, the pure steps as tables: the other sharing layers' fingerprints (layers.py: preloaded files'
exports, a socket's type, this glibc), their commit families, what each meters (metering.py), the problems
their conditions are, and what the guard supplies for a vCUDA build whose look-ups swap in legacy ABIs."""

from __future__ import annotations

import pytest
from facts_kit import REAL_DRIVER, VCUDA, driver, facts

from vllm_tmaguard import codes
from vllm_tmaguard.stages import layers as fingerprints
from vllm_tmaguard.stages.elf import EM_X86_64, ElfInfo
from vllm_tmaguard.stages.gpu import GpuFacts
from vllm_tmaguard.stages.layers import LABELS, Layer, PodEvidence, detect_layers
from vllm_tmaguard.stages.metering import layer_problems, metering_json, metering_of
from vllm_tmaguard.stages.record import outcome_of
from vllm_tmaguard.stages.supply import plan_supply
from vllm_tmaguard.stages.toggles import Toggles

LIB = "/usr/local/nvidia/lib64/libcuda.so.1"
# The CUDA 12 fork: CUDA 12.2 headers' names, not cuTensorMapEncodeIm2colWide.
FORK = VCUDA | {
    "cuGetProcAddress_v2", "cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col", "cuLaunchKernelEx",
}  # fmt: skip
GLIBC_TOO_NEW, KUBESHARE_HOOK, NVSHARE_SOCKET = (
    fingerprints.GLIBC_TOO_NEW, fingerprints.KUBESHARE_HOOK, fingerprints.NVSHARE_SOCKET,
)  # fmt: skip
OVERSOLD, SOCKET_MISSING, SOCKET_NOT_A_SOCKET = (
    fingerprints.OVERSOLD, fingerprints.SOCKET_MISSING, fingerprints.SOCKET_NOT_A_SOCKET,
)  # fmt: skip


def elf(defined: set[str] | frozenset[str], soname: str | None = "libcuda.so.1", undefined=(), path=LIB):
    return ElfInfo(path, EM_X86_64, soname, (), frozenset(defined), frozenset(undefined))


def pod(
    libcuda: ElfInfo | None = None, preload=(), environ=None, paths=(), preloaded=None, kinds=None, lacks=(),
) -> PodEvidence:
    return PodEvidence(
        frozenset(paths), tuple(preload), environ or {}, libcuda or elf(REAL_DRIVER), preloaded or {},
        kinds or {}, tuple(lacks),
    )  # fmt: skip


VGPU = "/etc/vgpu-manager/driver/libvgpu-control.so"
NVSHARE = "/usr/lib/nvshare/libnvshare.so"
HAMI = "/usr/local/vgpu/libvgpu.so"
HOOK_NEEDS = elf({"dlsym", "cuMemAlloc_v2"}, None, {"__libc_dlopen_mode", "__libc_dlsym"}, KUBESHARE_HOOK)

# name -> (evidence, [(layer, family, conditions)])
CASES = {
    "vCUDA fork ec4dee1 (its helpers; no Im2colWide)": (
        pod(elf(FORK | {"search_on_pids_table"}, "libcuda-control.so")), [("vcuda-fork", "ec4dee1", ())],
    ),
    "a vCUDA fork by cuGetProcAddress_v2 and the tiled encoder alone": (
        pod(elf(FORK, "libcuda-control.so")), [("vcuda-fork", None, ())],
    ),
    "tkestack master (its hook table)": (
        pod(elf(VCUDA | {"cuda_hooks_entry"}, "libcuda-control.so")), [("vcuda", "master", ())],
    ),
    "tkestack v1.0.5 (its limiter's delta exported)": (
        pod(elf(VCUDA | {"delta"}, "libcuda-control.so")), [("vcuda", "v1.0.5", ())],
    ),
    "vgpu-manager from the preload file": (
        pod(preload=[VGPU], environ={"CUDA_MEM_LIMIT_0": "8192m"}), [("vgpu-manager", None, ())],
    ),
    "vgpu-manager overselling": (
        pod(preload=[VGPU], environ={"CUDA_MEM_RATIO": "1.5"}), [("vgpu-manager", None, (OVERSOLD,))],
    ),
    "vgpu-manager overselling by its switch for a device": (
        pod(preload=[VGPU], environ={"CUDA_MEM_OVERSOLD_0": "true"}), [("vgpu-manager", None, (OVERSOLD,))],
    ),
    "vgpu-manager overselling by its switch": (
        pod(preload=[VGPU], environ={"CUDA_MEM_OVERSOLD": " 1 "}), [("vgpu-manager", None, (OVERSOLD,))],
    ),
    "vgpu-manager with its switch off and a ratio of 1": (
        pod(preload=[VGPU], environ={"CUDA_MEM_OVERSOLD_0": "false", "CUDA_MEM_RATIO": "1"}),
        [("vgpu-manager", None, ())],
    ),
    "vgpu-manager's variables without its preload": (pod(environ={"CUDA_MEM_LIMIT_0": "8192m"}), []),
    "nvshare with its scheduler's socket": (
        pod(preload=[NVSHARE], kinds={NVSHARE_SOCKET: "a socket"}), [("nvshare", None, ())],
    ),
    "nvshare without it": (
        pod(preload=[NVSHARE], kinds={NVSHARE_SOCKET: "missing"}), [("nvshare", None, (SOCKET_MISSING,))],
    ),
    "nvshare with a directory there": (
        pod(preload=[NVSHARE], kinds={NVSHARE_SOCKET: "a directory"}),
        [("nvshare", None, (SOCKET_NOT_A_SOCKET,))],
    ),
    "KubeShare preloaded on a glibc that lacks __libc_dlopen_mode": (
        pod(preload=[KUBESHARE_HOOK], preloaded={KUBESHARE_HOOK: HOOK_NEEDS}, lacks=["__libc_dlopen_mode"]),
        [("kubeshare", None, (GLIBC_TOO_NEW,))],
    ),
    "KubeShare on an old glibc": (
        pod(preload=[KUBESHARE_HOOK], preloaded={KUBESHARE_HOOK: HOOK_NEEDS}), [("kubeshare", None, ())],
    ),
    "KubeShare in a debug copy (hook mounted, its variable, no preload)": (
        pod(environ={"POD_MANAGER_PORT": "50051"}, paths=[KUBESHARE_HOOK],
            preloaded={KUBESHARE_HOOK: HOOK_NEEDS}, lacks=["__libc_dlopen_mode", "__libc_dlsym"]),
        [("kubeshare", None, (GLIBC_TOO_NEW,))],
    ),
    "KubeShare's mount without its variable": (pod(paths=[KUBESHARE_HOOK]), []),
    "lupine's client by its exports": (
        pod(elf(REAL_DRIVER | {"lupine_checkpoint_drain_cuda_calls", "dlsym"})), [("lupine", "7fbd364", ())],
    ),
    "HAMi-core 93cf05d": (
        pod(preload=[HAMI], preloaded={HAMI: elf({"dlsym", "cuDeviceGetAttribute", "cuMemCreate"}, None)}),
        [("hami", "93cf05d", ())],
    ),
    "HAMi-core 8c32de6": (
        pod(preload=[HAMI], preloaded={HAMI: elf({"dlsym", "cuLaunchKernelEx", "cuMemRelease"}, None)}),
        [("hami", "8c32de6", ())],
    ),
    "HAMi-core 8f3a89c": (
        pod(preload=[HAMI], preloaded={HAMI: elf({"dlsym", "cuLaunchKernelEx", "ensure_post_init"}, None)}),
        [("hami", "8f3a89c", ())],
    ),
    "HAMi-core built with hidden visibility": (
        pod(preload=[HAMI], preloaded={HAMI: elf({"dlsym"}, None)}), [("hami", "hidden-build", ())],
    ),
    "HAMi-core whose build cannot be placed": (pod(preload=[HAMI]), [("hami", None, ())]),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_layers(name: str) -> None:
    evidence, expected = CASES[name]
    layers = detect_layers(evidence, 13000)
    assert [(layer.name, layer.family, layer.conditions) for layer in layers] == expected
    assert all(layer.evidence and layer.label == LABELS[layer.name] for layer in layers)


def test_metering_tables_and_caveats() -> None:
    assert metering_of(Layer("hami", ("x",))) is None  # a build no research placed: no claim
    fork = metering_of(Layer("vcuda-fork", ("x",), family="ec4dee1"))
    assert fork is not None and dict(fork.rows)["unmetered"][:2] == ("cuMemCreate", "cuMemAllocAsync")
    (v105,) = metering_json((Layer("vcuda", ("x",), family="v1.0.5"),))
    assert [c["code"] for c in v105["caveats"]] == ["sm-limiter-overflow"]
    assert v105["caveats"][0]["severity"] == "warning"
    (old,) = metering_json((Layer("hami", ("x",), family="93cf05d"),))
    assert "cuLaunchKernelEx" in old["rows"]["unthrottled"] and "cuMemCreate" in old["rows"]["unmetered"]
    (oversold,) = metering_json((Layer("vgpu-manager", ("x",), conditions=(OVERSOLD,)),))
    assert [c["code"] for c in oversold["caveats"]] == ["core-limiter-timing", "oversold-managed-memory"]
    assert oversold["caveats"][1]["vllm_args"] == ["--disable-custom-all-reduce"]


def test_conditions_are_problems_with_their_fixes() -> None:
    layers = (
        Layer("nvshare", ("x",), conditions=(SOCKET_MISSING,)),
        Layer("kubeshare", ("x",), conditions=(GLIBC_TOO_NEW,)),
        Layer("vgpu-manager", ("x",), conditions=(OVERSOLD,)),  # a caveat, not a problem
    )
    problems = layer_problems(layers)
    assert [p.code for p in problems] == [codes.LAYER_DAEMON_MISSING, codes.LAYER_CANNOT_LOAD]
    assert all(p.fix and p.subject for p in problems)


FORK_LAYER = (Layer("vcuda-fork", ("libcuda.so.1 has SONAME libcuda-control.so",), family="ec4dee1"),)


def test_a_vcuda_builds_look_ups_are_answered_by_the_overlay() -> None:
    plan = plan_supply(facts(driver(FORK, soname="libcuda-control.so"), FORK_LAYER), Toggles())
    assert plan.lacking == () and plan.replaced == ("cuGetProcAddress", "cuGetProcAddress_v2")
    assert [s.library for s in plan.supplies] == ["overlay"] and plan.problems == ()
    assert plan.encoder.reachable


def test_a_vcuda_builds_look_ups_unanswered_are_a_problem() -> None:
    for toggles, how in ((Toggles(overlay="off"), "LD_LIBRARY_PATH"), (Toggles(), "mapped")):
        plan = plan_supply(facts(driver(FORK, soname="libcuda-control.so", how=how), FORK_LAYER), toggles)
        assert plan.supplies == () and plan.replaced == ()
        assert [(p.code, p.symbol) for p in plan.problems] == [(codes.LOOKUP_SWAPPED, "cuGetProcAddress_v2")]


def test_behind_the_installed_overlay_nothing_more_is_needed() -> None:
    control = "/usr/local/nvidia/lib64/libcuda-control.so"
    overlaid = driver(FORK, soname="libcuda-control.so", overlay_of=control)
    plan = plan_supply(facts(overlaid, FORK_LAYER), Toggles())
    assert (plan.status, plan.supplies, plan.replaced) == ("complete", (), ())


def test_outcome_of_look_ups_answered_alone_is_supplied() -> None:
    plan = plan_supply(facts(driver(FORK, soname="libcuda-control.so"), FORK_LAYER), Toggles())
    assert outcome_of(facts(driver(FORK)), GpuFacts(), plan, (), True) == codes.SUPPLIED
    assert outcome_of(facts(driver(FORK)), GpuFacts(), plan, (), False) == codes.WOULD_SUPPLY
