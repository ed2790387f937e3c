"""Findings about the platform: the GPUs (the kernel module's files), the libcuda.so.1 the loader gives,
the installed vLLM, and the sharing layer with the caveats known from the field."""

from __future__ import annotations

from typing import Any

from .base import finding, fix

_GPU_REQUEST = [
    "runtimeClassName: nvidia  # the pod spec",
    "resources:",
    "  limits:",
    "    nvidia.com/gpu: 1",
]


def gpu_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPUs as the kernel module's files show them to this pod (gpu.py): read without NVML, which in a
    vCUDA pod is the sharing layer (NVML itself: --active)."""
    gpu = report["gpu"]
    if gpu["error"]:
        return [
            finding(
                "no-driver-module",
                "error",
                "No NVIDIA kernel module visible",
                f"{gpu['error']}: this container does not see the host's NVIDIA driver.",
                fix=fix(
                    "Run the pod on a GPU node with the NVIDIA container runtime and request a GPU.",
                    manifest=_GPU_REQUEST,
                ),
            )
        ]
    if not gpu["gpus"]:
        return [
            finding(
                "no-gpu",
                "error",
                "No NVIDIA GPU given to this container",
                "The driver is loaded but no /dev/nvidiaN of its GPUs is in this container: vLLM will not "
                "find a CUDA platform.",
                fix=fix(
                    "Request a GPU for the container.",
                    manifest=_GPU_REQUEST,
                ),
            )
        ]
    return []


def libcuda_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    libcuda = report["libcuda"]
    if libcuda["path"] is None:
        skipped = "; ".join(libcuda["skipped"])
        return [
            finding(
                "libcuda-missing",
                "error",
                "No usable libcuda.so.1",
                "The loader finds no libcuda.so.1"
                + (f" it can load (passed over: {skipped})" if skipped else "")
                + ": vLLM's CUDA extensions cannot load.",
                fix=fix(
                    "Mount the NVIDIA driver into the container (NVIDIA container toolkit, runtimeClassName: "
                    "nvidia) or put the directory holding libcuda.so.1 on LD_LIBRARY_PATH."
                ),
            )
        ]
    if libcuda["error"]:
        return [
            finding(
                "libcuda-unreadable",
                "error",
                "libcuda.so.1 cannot be read",
                f"{libcuda['path']}: {libcuda['error']}. What it exports cannot be checked, and the loader "
                "will fail on it too.",
                fix=fix("Replace the damaged file (reinstall the driver or the sharing layer)."),
            )
        ]
    return []


def vllm_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    if report["vllm"]["found"]:
        return []
    return [
        finding(
            "vllm-missing",
            "error",
            "vLLM is not installed for this Python",
            f"No vllm package on {report['python']['executable']}'s sys.path: its extensions, architectures "
            "and kernel routing cannot be checked.",
            fix=fix(
                "Run the doctor with vLLM's Python, or point it at vLLM: tmaguard doctor --vllm-dir DIR."
            ),
        )
    ]


def layer_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    findings = []
    exports = {row["name"]: row for row in report["consumers"]}
    vmm = exports.get("vllm.cumem_allocator")
    overlay = report["libcuda"]["overlay_of"]
    for layer in report["layers"]:
        name = layer["name"]
        title = f"GPU-sharing layer: {layer['label']}"
        if overlay and layer is report["layers"][0]:
            title += f", behind tmaguard's overlay (installed in front of {overlay})"
        findings.append(finding("layer", "info", title, "; ".join(layer["evidence"]), subject=name))
        if name == "hami":
            findings.append(
                finding(
                    "known-hami-tensor-parallel",
                    "info",
                    "HAMi-core with tensor parallel > 1",
                    "NCCL, cuMemCreate (VMM) and CUDA IPC are known to misbehave under HAMi-core's "
                    "interception when vLLM runs several GPU workers: hangs or failures in vLLM's custom "
                    "all-reduce.",
                    subject=name,
                    fix=fix(
                        "With --tensor-parallel-size > 1, turn vLLM's custom all-reduce off.",
                        vllm_args=["--disable-custom-all-reduce"],
                    ),
                )
            )
        elif name == "lupine" and not (report["decision"].get("encoder") or {}).get("reachable"):
            findings.append(
                finding(
                    "known-lupine-no-local-driver",
                    "info",
                    "lupine: no local driver behind the layer",
                    "The GPU is reached over the network, so an entry point the layer lacks cannot be "
                    "forwarded to a local driver: the guard's encoders answer CUDA_ERROR_NOT_SUPPORTED and "
                    "vLLM's TMA kernels must be routed away (the guard does so).",
                    subject=name,
                )
            )
        elif name.startswith("vcuda") and vmm is not None and vmm["lacks"]:
            findings.append(
                finding(
                    "known-vcuda-sleep-mode",
                    "info",
                    "vCUDA without the VMM entry points: sleep mode fails",
                    f"This libcuda.so.1 lacks {', '.join(vmm['lacks'])}; vLLM's sleep mode "
                    "(--enable-sleep-mode, the CuMem allocator) needs them.",
                    subject=name,
                    fix=fix("Do not pass --enable-sleep-mode on this pod."),
                )
            )
    return findings
