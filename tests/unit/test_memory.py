"""The memory stage's pure decisions (memory.py) and the compat switch's (compat.py): the limit as each layer
writes it, the fraction that fits it, and what is said or done about vLLM's."""

from __future__ import annotations

import pytest
from podkit import vcuda_config_bytes

from vllm_tmaguard.codes import COMPAT_BYPASSES_LAYER, MEMORY_FRACTION_TOO_HIGH, MEMORY_UNENFORCED
from vllm_tmaguard.process import is_server, memory_settings
from vllm_tmaguard.stages.compat import plan_compat, switch_on
from vllm_tmaguard.stages.memory import (
    GIB,
    MemoryFlags,
    MemoryLimit,
    env_limit,
    fitting_fraction,
    parse_size,
    plan_memory,
    vcuda_limit,
)

SERVER = MemoryFlags(serve=True)


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("8g", 8 * GIB), ("8G", 8 * GIB), ("8192m", 8 * GIB), ("8589934592", 8 * GIB), ("8Gi", 8 * GIB),
        ("1024k", 1 << 20), (" 8g ", 8 * GIB), ("0", None), ("8x", None), ("", None), ("-1g", None),
        ("8.5g", None),
    ],
)  # fmt: skip
def test_sizes_as_the_layers_write_them(value: str, size: int | None) -> None:
    assert parse_size(value) == size


def test_the_smallest_enforced_limit_of_the_environment() -> None:
    environ = {
        "CUDA_DEVICE_MEMORY_LIMIT_0": "20g",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "8g",
        "CUDA_MEM_LIMIT_X": "1g",
    }
    assert env_limit(environ) == MemoryLimit(8 * GIB, "CUDA_DEVICE_MEMORY_LIMIT_1=8g")
    assert env_limit({"CUDA_MEM_LIMIT_0": "8192m"}) == MemoryLimit(8 * GIB, "CUDA_MEM_LIMIT_0=8192m")
    assert env_limit({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "1=2G,0=8G"}).limit == 8 * GIB
    assert env_limit({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "4G"}).limit == 4 * GIB
    assert env_limit({"CUDA_DEVICE_MEMORY_LIMIT_0": "lots", "CUDA_DEVICE_SM_LIMIT": "50"}) is None


def test_the_vcuda_quota_from_its_resource_data() -> None:
    assert vcuda_limit(vcuda_config_bytes(8 * GIB)) == 8 * GIB
    assert vcuda_limit(vcuda_config_bytes(8 * GIB, enable=False)) is None  # gpu-manager's whole GPUs
    assert vcuda_limit(b"8589934592\n") is None  # not a resource_data_t
    assert vcuda_limit(vcuda_config_bytes(8 * GIB) + b"\0") is None


@pytest.mark.parametrize(
    ("limit_gib", "fits"),
    [
        (8, "0.84"),
        (16, "0.92"),
        (24, "0.94"),
        (80, "0.98"),
        (4, "0.68"),
        (2, "0.37"),
        (1.25, None),
        (1, None),
    ],
)
def test_the_fraction_that_leaves_the_headroom(limit_gib: float, fits: str | None) -> None:
    # 8 GiB: 0.85 started under all three layers measured, 0.88 did not (docs/real-layers.md).
    assert fitting_fraction(int(limit_gib * GIB)) == fits


EIGHT = MemoryLimit(8 * GIB, "CUDA_DEVICE_MEMORY_LIMIT_0=8g")


def test_vllms_default_is_set_to_what_fits_on_a_server() -> None:
    plan = plan_memory(EIGHT, SERVER, (), "fit")
    assert (plan.set_to, plan.chosen, plan.by_user, plan.problems) == ("0.84", "0.84", False, ())


def test_a_users_value_is_never_changed_only_warned_about() -> None:
    plan = plan_memory(EIGHT, MemoryFlags("0.92", None, True), (), "fit")
    (problem,) = plan.problems
    assert plan.set_to is None and problem.code == MEMORY_FRACTION_TOO_HIGH
    assert problem.fix == "--gpu-memory-utilization 0.84" and "0.64 GiB of the layer's 8 GiB" in problem.cause
    assert plan_memory(EIGHT, MemoryFlags("0.8", None, True), (), "fit").problems == ()


def test_warn_and_off_and_a_kv_cache_budget() -> None:
    (warned,) = plan_memory(EIGHT, SERVER, (), "warn").problems
    assert "TMAGUARD_MEMORY=fit" in warned.fix and "(vLLM default)" in warned.cause
    assert plan_memory(EIGHT, SERVER, (), "off") == plan_memory(None, MemoryFlags(), (), "off")._replace(
        limit=EIGHT, fits="0.84"
    )
    assert plan_memory(EIGHT, MemoryFlags("0.95", "4294967296", True), (), "fit").problems == ()


def test_a_process_that_is_no_server_is_neither_given_the_flag_nor_warned() -> None:
    # A Ray worker (or any process whose engine is built elsewhere): its argv says nothing of its fraction.
    plan = plan_memory(EIGHT, MemoryFlags(), (), "fit")
    assert (plan.set_to, plan.problems, plan.fits) == (None, (), "0.84")
    assert plan_memory(EIGHT, MemoryFlags("0.95", None, False), (), "fit").problems  # a value given: said


def test_a_limit_nothing_fits() -> None:
    (problem,) = plan_memory(MemoryLimit(GIB, "x"), SERVER, (), "fit").problems
    assert problem.fix.startswith("a larger memory limit")


def test_sharing_without_a_limit() -> None:
    (problem,) = plan_memory(None, SERVER, ("nvshare",), "fit").problems
    assert problem.code == MEMORY_UNENFORCED and "nvshare" in problem.cause
    (kai,) = plan_memory(None, SERVER, ("a KAI fraction",), "fit", "0.5").problems
    assert "below 0.5" in kai.fix
    assert plan_memory(None, MemoryFlags("0.4", None, True), ("nvshare",), "fit").problems == ()
    assert plan_memory(None, SERVER, (), "fit").problems == ()


@pytest.mark.parametrize(
    ("argv", "settings"),
    [
        (["vllm", "serve", "M"], (None, None)),
        (["vllm", "serve", "M", "--gpu-memory-utilization", "0.5"], ("0.5", None)),
        (["vllm", "serve", "M", "--gpu_memory_utilization=0.5", "--gpu-memory-utilization=0.6"], ("0.6", None)),  # noqa: E501
        (["vllm", "serve", "M", "--device-memory-utilization", "0.7"], ("0.7", None)),
        (["vllm", "serve", "M", "--kv-cache-memory-bytes", "4G"], (None, "4G")),
    ],
)  # fmt: skip
def test_memory_flags_as_written(argv: list[str], settings: tuple) -> None:
    assert memory_settings(argv) == settings


def test_a_config_files_settings_come_before_the_command_lines() -> None:
    argv = ["vllm", "serve", "M", "--config", "c.yaml", "--gpu-memory-utilization", "0.6"]
    assert memory_settings(argv, {"gpu-memory-utilization": 0.7}) == ("0.6", None)
    assert memory_settings(argv[:5], {"gpu_memory_utilization": 0.7, "kv-cache-memory-bytes": 5}) == (
        "0.7",
        "5",
    )


@pytest.mark.parametrize(
    ("argv", "module", "server"),
    [
        (["/usr/local/bin/vllm", "serve", "M"], None, True),
        (["/usr/local/bin/vllm", "bench", "M"], None, False),
        (["-m", "serve", "M"], "vllm.entrypoints.cli.main", True),
        (["-m", "--model", "M"], "vllm.entrypoints.openai.api_server", True),
        (["-m", "serve"], "some.other.module", False),
        (["/x/vllm/entrypoints/openai/api_server.py", "--model", "M"], None, True),
        (["-c", "serve"], None, False),
        ([], None, False),
    ],
)
def test_which_processes_are_a_servers_front(argv: list[str], module: str | None, server: bool) -> None:
    assert is_server(argv, module) is server


VCUDA = (("vcuda", "tkestack vCUDA"),)


@pytest.mark.parametrize("value", ["1", "true", " TRUE ", "True"])
def test_the_compat_switch_is_turned_off_under_a_replacing_layer(value: str) -> None:
    environ = {
        "VLLM_ENABLE_CUDA_COMPATIBILITY": value,
        "VLLM_CUDA_COMPATIBILITY_PATH": "/usr/local/cuda/compat",
    }
    plan = plan_compat(environ, VCUDA, apply=True)
    (problem,) = plan.problems
    assert switch_on(environ) and plan.env == {"VLLM_ENABLE_CUDA_COMPATIBILITY": "0"}
    assert problem.code == COMPAT_BYPASSES_LAYER and "/usr/local/cuda/compat" in problem.cause
    assert plan_compat(environ, VCUDA, apply=False).env == {}  # validate: said, not done


@pytest.mark.parametrize(
    ("environ", "layers"),
    [
        ({"VLLM_ENABLE_CUDA_COMPATIBILITY": "0"}, VCUDA),
        ({"VLLM_ENABLE_CUDA_COMPATIBILITY": "yes"}, VCUDA),  # env_override reads only 1 and true
        ({"VLLM_ENABLE_CUDA_COMPATIBILITY": "1"}, (("hami", "HAMi-core"),)),  # NVIDIA's libcuda.so.1 stays
        ({"VLLM_ENABLE_CUDA_COMPATIBILITY": "1"}, ()),
    ],
)
def test_the_compat_switch_is_left_alone_elsewhere(environ: dict, layers: tuple) -> None:
    assert plan_compat(environ, layers, apply=True) == ({}, ())
