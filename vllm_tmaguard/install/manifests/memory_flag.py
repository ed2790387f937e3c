"""vLLM's memory fraction from the pod's GPU-memory request (docs/design.md §2.13): where a container that
runs `vllm serve` asks a sharing layer's device plugin for a slice of GPU memory and leaves vLLM's default
fraction, the rendered container gets `--gpu-memory-utilization <the value that fits>`, the same value the
guard would set in the process (memory.fitting_fraction), so that the manifest says what vLLM will run with.
Only an exec-form command line is extended (a shell script's is the guard's to set at start-up), and never
one that sizes vLLM's memory already. Pure: the caller edits the container."""

from __future__ import annotations

from typing import Any

from ...stages.memory import FRACTION_FLAG, fitting_fraction

# Extended resources that carry the container's GPU-memory slice, with the bytes one unit stands for.
RESOURCES = {
    "nvidia.com/gpumem": 1 << 20,  # HAMi (MiB)
    "volcano.sh/vgpu-memory": 1 << 20,  # Volcano's vGPU device plugin (HAMi-core; MiB)
    "nvidia.com/vgpu-memory": 1 << 20,  # vgpu-manager (MiB, times its node's --device-memory-factor, 1)
    "tencent.com/vcuda-memory": 256 << 20,  # tkestack gpu-manager: MemoryBlockSize (pkg/types/types.go)
}
_SIZING = ("--gpu-memory-utilization", "--device-memory-utilization", "--kv-cache-memory-bytes")


def requested_memory(container: dict[str, Any]) -> tuple[int, str] | None:
    """The GPU memory the container asks a sharing layer for (its limit, else its request), with what said
    so; None where it asks none of RESOURCES or the amount is not a whole number."""
    resources = container.get("resources") if isinstance(container.get("resources"), dict) else {}
    for field in ("limits", "requests"):
        asked = resources.get(field) if isinstance(resources.get(field), dict) else {}
        for name, unit in RESOURCES.items():
            value = str(asked.get(name, "")).strip()
            if value.isdigit() and int(value) > 0:
                return int(value) * unit, f"resources.{field}[{name}]={value}"
    return None


def _sized(words: list[str]) -> bool:
    normal = [w.replace("_", "-").partition("=")[0] for w in words]
    return any(w in _SIZING or any(w.startswith(s + ".") for s in _SIZING) for w in normal)


def fraction_args(container: dict[str, Any]) -> list[str] | None:
    """The container's `args` with `--gpu-memory-utilization <fits>` added, or None where nothing is to add:
    no GPU-memory request, a limit vLLM's default fits, a command line that sizes vLLM's memory already, or
    one that is not `vllm serve` in exec form (the image's `vllm serve` entry point with args, or a command
    `vllm serve ...`)."""
    requested = requested_memory(container)
    if requested is None:
        return None
    fits = fitting_fraction(requested[0])
    if fits is None or float(fits) >= 0.92:
        return None
    command = [str(w) for w in container.get("command") or []]
    args = [str(w) for w in container.get("args") or []]
    words = command + args
    serve = any(
        w.rsplit("/", 1)[-1] == "vllm" and words[i + 1 : i + 2] == ["serve"] for i, w in enumerate(words)
    ) or (not command and bool(args))  # vLLM's image: its entry point is `vllm serve`
    shell = any(w in ("-c", "sh", "bash", "/bin/sh", "/bin/bash") for w in command)
    if not serve or shell or _sized(words):
        return None
    return [*args, FRACTION_FLAG, fits]
