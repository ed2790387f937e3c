"""The memory fraction a manifest gets from the pod's GPU-memory request (manifests/memory_flag.py)."""

from __future__ import annotations

import pytest

from vllm_tmaguard.install.manifests.memory_flag import fraction_args, requested_memory

IMAGE = "vllm/vllm-openai:v0.32.0"


def container(limits: dict, **fields) -> dict:
    return {"name": "vllm", "image": IMAGE, "resources": {"limits": limits}, **fields}


@pytest.mark.parametrize(
    ("limits", "size"),
    [
        ({"nvidia.com/gpumem": "8192"}, 8 << 30),
        ({"nvidia.com/vgpu-memory": 8192}, 8 << 30),
        ({"volcano.sh/vgpu-memory": "8192"}, 8 << 30),
        ({"tencent.com/vcuda-memory": "32"}, 8 << 30),  # 256 MiB blocks
        ({"nvidia.com/gpu": "1"}, None),
        ({"nvidia.com/gpumem": "8Gi"}, None),  # not the unit HAMi counts in
    ],
)
def test_the_request_in_each_layers_unit(limits: dict, size: int | None) -> None:
    found = requested_memory(container(limits))
    assert (found[0] if found else None) == size


def test_vllms_image_with_its_own_entry_point_gets_the_flag() -> None:
    c = container({"nvidia.com/gpumem": "8192"}, args=["Qwen/Qwen3-8B", "--port", "8000"])
    assert fraction_args(c) == ["Qwen/Qwen3-8B", "--port", "8000", "--gpu-memory-utilization", "0.84"]
    exec_form = container({"tencent.com/vcuda-memory": "32"}, command=["vllm", "serve"], args=["m"])
    assert fraction_args(exec_form) == ["m", "--gpu-memory-utilization", "0.84"]


@pytest.mark.parametrize(
    "fields",
    [
        {"args": ["m", "--gpu-memory-utilization", "0.5"]},  # the chart's own value stands
        {"args": ["m", "--gpu_memory_utilization=0.5"]},
        {"args": ["m", "--kv-cache-memory-bytes", "4294967296"]},
        {"command": ["bash", "-c", "vllm serve m"]},  # a shell script: the guard sets it at start-up
        {"command": ["python3", "router.py"], "args": ["--x"]},  # not vLLM
    ],
)
def test_left_alone(fields: dict) -> None:
    assert fraction_args(container({"nvidia.com/gpumem": "8192"}, **fields)) is None


def test_a_limit_the_default_fits_is_left_alone() -> None:
    assert fraction_args(container({"nvidia.com/gpumem": "24576"}, args=["m"])) is None
