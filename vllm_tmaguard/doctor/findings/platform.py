"""Findings about the platform: the GPUs (NVML), the libcuda.so.1 the loader gives, the installed vLLM, and
the sharing layer with the caveats known from the field."""

from __future__ import annotations

from typing import Any

from .base import finding, fix


def gpu_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    gpu = report["gpu"]
    query = gpu["query"]
    findings = []
    if query["timed_out"]:
        findings.append(
            finding(
                "nvml-timeout",
                "error",
                f"NVML did not answer within {query['timeout_s']:g} s",
                "The NVML query (in a child process) hung and was killed. vLLM detects CUDA through NVML at "
                "start-up, so it hangs the same way.",
                fix=fix(
                    "Check the sharing layer's NVML and the daemon or socket it talks to (vCUDA: "
                    "/etc/vcuda/vcuda.sock); rerun with --nvml-timeout SECONDS to wait longer."
                ),
            )
        )
    elif gpu["error"]:
        crashed = query["exit_status"] not in (0, None)
        findings.append(
            finding(
                "nvml-crashed" if crashed else "nvml-error",
                "error",
                "NVML query crashed" if crashed else "NVML cannot report the GPUs",
                f"{gpu['error']}. vLLM detects CUDA through NVML: without it vLLM does not use the GPU.",
                fix=fix(
                    "Mount the driver's libnvidia-ml.so.1 (NVIDIA container toolkit, "
                    "NVIDIA_DRIVER_CAPABILITIES=compute,utility) or fix the sharing layer's NVML."
                ),
            )
        )
    elif not gpu["gpus"]:
        findings.append(
            finding(
                "no-gpu",
                "error",
                "No NVIDIA GPU visible",
                "NVML reports 0 devices: vLLM will not find a CUDA platform.",
                fix=fix(
                    "Request a GPU for the container.",
                    manifest=["resources:", "  limits:", "    nvidia.com/gpu: 1"],
                ),
            )
        )
    for g in gpu["gpus"]:
        if g["mig"]:
            findings.append(
                finding(
                    "mig",
                    "info",
                    f"GPU {g['index']} is in MIG mode",
                    "Each MIG instance is its own CUDA device; address it by its MIG UUID.",
                    subject=str(g["index"]),
                )
            )
        if g["virtualization"] not in (None, "none"):
            findings.append(
                finding(
                    "virtualization",
                    "info",
                    f"GPU {g['index']} virtualization mode: {g['virtualization']}",
                    "An NVIDIA vGPU guest or pass-through: the driver inside is NVIDIA's.",
                    subject=str(g["index"]),
                )
            )
    return findings


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
    for layer in report["layers"]:
        name = layer["name"]
        findings.append(
            finding(
                "layer",
                "info",
                f"GPU-sharing layer: {name}",
                "; ".join(layer["evidence"]),
                subject=name,
            )
        )
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
        elif name == "lupine":
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
