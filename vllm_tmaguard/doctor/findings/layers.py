"""Findings about what a sharing layer does to vLLM beyond what libcuda.so.1 lacks: what it meters and what
bypasses it (the record's `metering`, per commit family: metering.py), its known caveats with their fixes,
the look-ups the overlay answers instead of the layer, what the conditions found beside it break (its
daemon's socket missing, a hook this glibc cannot load, a layer configured but not loaded), and which build
its library is (the record's `layer_files`)."""

from __future__ import annotations

from typing import Any

from ...codes import CUDA_BROKEN, LAYER_NOT_IN_FORCE
from ...stages import metering as m
from .base import finding, fix

_STATUS_WORDS = {
    m.METERED: "counted against its memory quota",
    m.VIRTUALISED: "answered by the layer (its quota), not the GPU",
    m.MANAGED: "turned into managed memory (capped per process only)",
    m.UNMETERED: "NOT counted against its quota",
    m.THROTTLED: "paced by its SM limiter",
    m.THROTTLED_BUT_CLUSTERS: "paced, except cluster launches",
    m.UNTHROTTLED: "NOT paced",
    m.LOCKED: "wait for its GPU lock (time slicing)",
    m.UNLOCKED: "run WITHOUT its GPU lock",
}
# What each unmetered or unpaced entry point means for vLLM, and how to keep vLLM off it.
_BYPASS_FIXES = {
    "cuMemCreate": "leave vLLM's sleep mode off (no --enable-sleep-mode), keep expandable_segments out of "
    "PYTORCH_CUDA_ALLOC_CONF and set NCCL_CUMEM_ENABLE=0: each allocates through cuMemCreate",
    "cuMemAllocAsync": "keep backend:cudaMallocAsync out of PYTORCH_CUDA_ALLOC_CONF",
    "cuGraphLaunch": "CUDA-graph replays (vLLM's decode) escape the layer's launch limit; --enforce-eager "
    "puts every launch under it, at a cost in speed",
    "cuLaunchKernelEx": "Triton's kernels (launched through cuLaunchKernelEx) escape the layer's launch "
    "limit",
}

# caveat -> (title, detail, fix text)
_CAVEATS = {
    m.SM_LIMITER_OVERFLOW: (
        "tkestack vCUDA v1.0.5: its SM limiter slows serving to about a quarter of bare speed",
        "v1.0.5's utilisation limiter overflows an int on a GPU with many SMs (132 on an H100) and throttles "
        "launches: `vllm serve` ran at 0.27-0.44 of bare throughput (docs/real-layers.md). Master fixed it.",
        "Build the layer from vcuda-controller master, or give the pod no core limit (a whole GPU's share).",
    ),
    m.HAMI_CUDA_128_HANG: (
        "HAMi-core 93cf05d (Volcano v1.10.0): hangs under CUDA 12.8+ runtimes",
        "Its dlsym initialises itself (nvmlInit) for cuGetExportTable, which CUDA 12.8+ runtimes ask first: "
        "the process hangs at start-up (HAMi-core#52; fixed by 0749777).",
        "Use HAMi-core 8c32de6 or newer (volcano-vgpu-device-plugin v1.12.0).",
    ),
    m.HAMI_FORK_AFTER_INIT: (
        "HAMi-core before 8f3a89c: a child forked after cuInit keeps no SM limiter",
        "Its post-init is not reset after fork: a process forked after its parent ran cuInit through HAMi "
        "inherits an SM-limit counter nothing refills, and with CUDA_DEVICE_SM_LIMIT set its launches stall. "
        "vLLM forks its workers only before CUDA is initialised, so vLLM itself is not exposed.",
        "Do not initialise CUDA in a parent that forks workers; HAMi-core 8f3a89c resets that state in the "
        "child.",
    ),
    m.HIDDEN_BUILD: (
        "HAMi-core built with hidden visibility: it meters nothing",
        "The preloaded libvgpu.so exports dlsym alone: every driver call reaches NVIDIA's driver unmetered, "
        "so neither the memory quota nor the SM limit holds.",
        "Build HAMi-core as its build.sh does (a Debug build, without -fvisibility=hidden).",
    ),
    m.CORE_LIMITER_TIMING: (
        "vgpu-manager's core limiter changes timing, and with it vLLM's batching",
        "With CUDA_CORE_LIMIT_<i> set it sleeps launches and synchronises the stream on its idle path: "
        "requests batch differently and timing-based autotuning may pick other kernels, so greedy texts can "
        "differ from a bare pod's without any number being wrong.",
        "Compare outputs one prompt at a time, with autotuning caches pinned, before suspecting the layer.",
    ),
    m.OVERSOLD_MANAGED: (
        "vgpu-manager oversold: allocations past the real memory become managed memory",
        "With CUDA_MEM_OVERSOLD or CUDA_MEM_RATIO > 1 it hands out managed memory past the GPU's own; "
        "CUDA IPC (vLLM's custom all-reduce at tensor parallel > 1) cannot register it.",
        "With --tensor-parallel-size > 1 on an oversold pod, turn vLLM's custom all-reduce off.",
    ),
    m.NO_QUOTA: (
        "No memory quota",
        "The layer keeps no per-pod memory limit: vLLM sizes its KV cache from what the GPU (or the layer) "
        "reports free.",
        "Set --gpu-memory-utilization to this pod's share of the GPU.",
    ),
    m.CUDA_GRAPH_CAPTURE_FAILS: (
        "nvshare: vLLM dies in CUDA-graph capture",
        "nvshare's cuLaunchKernel hook calls cuCtxSynchronize every N launches, which a capturing stream "
        "refuses (cudaErrorStreamCaptureUnsupported). No vLLM environment variable turns capture off.",
        'Pass --compilation-config \'{"cudagraph_mode": "NONE"}\' to vllm serve (keeps torch.compile), or '
        "--enforce-eager.",
    ),
    m.MANAGED_IPC: (
        "nvshare: cuMemAlloc becomes managed memory",
        "Allocations are oversubscribable and paged; CUDA IPC, which vLLM's custom all-reduce uses at tensor "
        "parallel > 1, does not support managed memory.",
        "With --tensor-parallel-size > 1, turn vLLM's custom all-reduce off.",
    ),
    m.TILED_ONLY: (
        "lupine: only cuTensorMapEncodeTiled is forwarded",
        "The client forwards the tiled encoder to its server; cuTensorMapEncodeIm2col, Im2colWide and "
        "ReplaceAddress answer CUDA_ERROR_NOT_SUPPORTED (reported as found): Triton's im2col TMA fails.",
        "",
    ),
    m.ROUND_TRIPS: (
        "lupine: each tensor-map encode and cluster launch is a server round trip",
        "Eager, a Machete call costs several synchronous round trips (Marlin's fewer); inside CUDA graphs "
        "the encodes happen once at capture.",
        "Keep CUDA graphs on (vLLM's default). Where vLLM runs eager, W4A16/W8A16 belong on Marlin (two "
        "round trips a call against Machete's six): the guard routes them so itself when the command line "
        "or its --config file says eager (--enforce-eager, -O0, cudagraph_mode NONE); set "
        "TMAGUARD_GEMM=latency where it cannot see that (the offline LLM(enforce_eager=True)).",
    ),
    m.HALF_CUBLAS_FAILS: (
        "lupine 7fbd364: fp16/bf16 cuBLAS GEMMs fail on sm_90",
        "Measured on an H100 (CUBLAS_STATUS_EXECUTION_FAILED, the guard off too; fp32 works): cuBLAS calls "
        "slot 4 of the driver's private export table 1734dc26-800d-4745-8726-c0f1e7dd8bca, which the client "
        "answers CUDA_ERROR_NOT_SUPPORTED (it forwards no private table; LUPINE_TRACE=1 shows the call). "
        "vLLM's unquantized fp16/bf16 layers go through cuBLAS and fail.",
        "No overlay can answer a private table for a GPU across the network: an unquantized model serves "
        "with --dtype float32 (fp32 GEMMs work, at twice the memory); a quantized one (GPTQ, AWQ: fp16/bf16 "
        "only, measured) needs a pod without lupine, or a lupine client that forwards that table.",
    ),
    m.METERS_NOTHING_CUDA12: (
        "KubeShare/Gemini meters nothing under CUDA 12+ runtimes",
        "Its hook answers only dlsym and the v1 cuGetProcAddress; CUDA 12+ runtimes look every entry point "
        "up through cuGetProcAddress_v2, which it passes to the driver: no memory quota, no time slicing.",
        "Rebuild Gemini's hook to hook cuGetProcAddress_v2 and cuLaunchKernelEx, or use another layer.",
    ),
}


def layer_detail_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    decision = report["decision"]
    findings = _broken_findings(decision) + _replaced_findings(report)
    labels = {layer["name"]: layer["label"] for layer in report["layers"]}
    files = decision.get("layer_files") or []
    findings += [_library_finding(f, labels.get(f["layer"], f["layer"])) for f in files]
    for layer in decision.get("metering") or []:
        findings.append(_metering_finding(layer, labels.get(layer["layer"], layer["layer"])))
        findings += [_caveat_finding(layer["layer"], caveat) for caveat in layer["caveats"]]
    return findings


def _broken_findings(decision: dict[str, Any]) -> list[dict[str, Any]]:
    """The problems after which no CUDA call succeeds in the pod (codes.CUDA_BROKEN), and a layer configured
    but not loaded (CUDA works, without the quota the pod was given)."""
    return [
        finding(
            problem["code"],
            "error",
            problem["cause"],
            problem["consequence"][:1].upper() + problem["consequence"][1:] + ".",
            subject=problem["subject"],
            fix=fix(problem["fix"][:1].upper() + problem["fix"][1:] + "."),
        )
        for problem in decision["problems"]
        if problem["code"] in CUDA_BROKEN or problem["code"] == LAYER_NOT_IN_FORCE
    ]


def _library_finding(library: dict[str, Any], label: str) -> dict[str, Any]:
    """Which build of the layer this pod has, to match a failure to a build across nodes."""
    parts = [f"{library['size']} bytes" if library.get("size") is not None else None]
    parts += [f"sha256 {library['sha256']}... (first 12 hex digits)" if library.get("sha256") else None]
    parts += [f"build ID {library['build_id']}" if library.get("build_id") else None]
    parts += [f"built by {'; '.join(library['versions'])}" if library.get("versions") else None]
    parts += [f"unreadable: {library['error']}" if library.get("error") else None]
    return finding(
        "layer-library",
        "info",
        f"{label}'s library: {library['path']}",
        ", ".join(p for p in parts if p) + ".",
        subject=library["layer"],
    )


def _replaced_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    replaced = report["decision"].get("replaced") or {}
    if not replaced:
        return []
    return [
        finding(
            "lookups-replaced",
            "ok",
            f"The layer's {', '.join(replaced)} answered by the guard's overlay",
            "This vCUDA build's look-ups swap in its hook by the requested base name: the CUDA runtime's "
            '("cuMemAlloc", 13000) would get its legacy cuMemAlloc, which fails with '
            "CUDA_ERROR_INVALID_CONTEXT (201). The overlay maps each request to the exact symbol "
            "(cuMemAlloc_v2) and binds the layer's export of it, so the call stays metered.",
            subject=", ".join(replaced),
        )
    ]


def _metering_finding(layer: dict[str, Any], label: str) -> dict[str, Any]:
    rows = layer["rows"]
    words = _STATUS_WORDS
    detail = "; ".join(f"{', '.join(names)}: {words.get(status, status)}" for status, names in rows.items())
    bypassed = [name for status in (m.UNMETERED, m.UNTHROTTLED, m.UNLOCKED) for name in rows.get(status, ())]
    fixes = [text for name, text in _BYPASS_FIXES.items() if name in bypassed]
    return finding(
        "layer-metering",
        "info",
        f"What {label} meters (read from {layer['source']})",
        (detail + "." if detail else "Nothing: no quota and no limiter."),
        subject=layer["layer"],
        fix=fix(_sentence("; ".join(fixes))) if fixes else None,
    )


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def _caveat_finding(layer: str, caveat: dict[str, Any]) -> dict[str, Any]:
    title, detail, text = _CAVEATS.get(caveat["code"], (caveat["code"], "", ""))
    args = caveat["vllm_args"]
    return finding(
        f"caveat-{caveat['code']}",
        caveat["severity"],
        title,
        detail,
        subject=layer,
        fix=fix(text, vllm_args=args) if text or args else None,
    )
