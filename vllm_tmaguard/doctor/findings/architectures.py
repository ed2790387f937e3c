"""Findings about the GPU code in vLLM's extensions: an extension vLLM imports at start-up without code for
a GPU here is an error, others are listed per GPU."""

from __future__ import annotations

from typing import Any

from .base import finding, fix


def arch_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    findings = []
    core = set(report["vllm"]["imported_at_platform_load"])
    missing: dict[str, list[str]] = {}
    jit_only: dict[str, list[str]] = {}
    for extension in report["architectures"]["extensions"]:
        module = extension["module"]
        if extension["error"]:
            if not any(row["name"] == module and row["error"] for row in report["consumers"]):
                findings.append(
                    finding(
                        "fatbin-unreadable",
                        "warning",
                        f"{module}: its GPU code cannot be read",
                        f"{extension['path']}: {extension['error']}",
                        subject=module,
                        fix=fix("Reinstall vLLM."),
                    )
                )
            continue
        for sm, result in extension["coverage"].items():
            carried = ", ".join(extension["sass"] + extension["ptx"])
            if result["verdict"] == "none":
                if module in core:
                    findings.append(
                        finding(
                            "arch-missing",
                            "error",
                            f"{module} has no {sm} code",
                            f"It carries {carried}: none of it runs on this GPU, and vLLM imports it at "
                            "start-up.",
                            subject=module,
                            fix=fix(f"Install a vLLM build compiled for {sm} (TORCH_CUDA_ARCH_LIST)."),
                        )
                    )
                else:
                    missing.setdefault(sm, []).append(f"{module} ({carried})")
            elif result["verdict"] == "jit":
                if module in core:
                    findings.append(
                        finding(
                            "arch-jit-only",
                            "warning",
                            f"{module} has no {sm} SASS, only PTX",
                            f"The driver JIT-compiles its kernels ({', '.join(extension['ptx'])}) on first "
                            "use: "
                            "slow start, and the compiled cache is lost with the pod.",
                            subject=module,
                            fix=fix(f"Install a vLLM build compiled for {sm} (TORCH_CUDA_ARCH_LIST)."),
                        )
                    )
                else:
                    jit_only.setdefault(sm, []).append(f"{module} ({', '.join(extension['ptx'])})")
    for sm in report["architectures"]["devices"]:
        parts = []
        if missing.get(sm):
            parts.append(
                f"no {sm} code in {'; '.join(missing[sm])}: vLLM selects these kernels only on the GPUs "
                "they were built for (sm_90a code runs on 9.0 only, sm_100f on 10.x)"
            )
        if jit_only.get(sm):
            parts.append(f"PTX only (JIT-compiled on first use) in {'; '.join(jit_only[sm])}")
        if parts:
            findings.append(
                finding(
                    "arch-coverage",
                    "info",
                    f"GPU code for {sm}: not every extension has it",
                    ". ".join(parts) + ".",
                    subject=sm,
                )
            )
    return findings
