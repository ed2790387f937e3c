"""On a Hopper device, in a pod whose libcuda.so.1 is the generated stand-in layer: torch CUDA work, a
Triton kernel, a Triton TMA kernel (host tensor descriptor: encoder and launch looked up in libcuda.so.1's
own handle) and vLLM 0.25.1's Machete W4A16 GEMM (a TMA kernel; encoder bound by the extension's
relocation), each checked against a reference, each in its own process (without the overlay, Triton calls
a NULL cuLaunchKernelEx and the process dies), with the layer's counters read after the step.
Prints one JSON line: {"mode": ..., step: {"ok": ..., ...}}."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import traceback

STEPS = {}


def step(name: str):
    def register(function):
        STEPS[name] = function
        return function

    return register


@step("vllm_import")
def _vllm():
    import vllm._custom_ops  # noqa: F401 - loads _C_stable_libtorch (U cuTensorMapEncodeTiled)


@step("torch")
def _torch():
    import torch

    a = torch.randn(2048, 2048, device="cuda")
    product = a @ a
    reference = a.double() @ a.double()
    error = ((product.double() - reference).norm() / reference.norm()).item()
    assert error < 1e-4, error
    return {"rel_error": error, "device": torch.cuda.get_device_name()}


@step("triton")
def _triton():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out + offsets, tl.load(x + offsets, mask=mask) + tl.load(y + offsets, mask=mask), mask=mask)

    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    out = torch.full_like(x, float("nan"))
    add[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    assert torch.equal(out, x + y)


@step("triton_tma")
def _triton_tma():
    import torch
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor

    @triton.jit
    def scale_tiles(source, out, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        row, col = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
        tile = source.load([row, col])
        rows, cols = row + tl.arange(0, BLOCK_M), col + tl.arange(0, BLOCK_N)
        tl.store(out + rows[:, None] * n_cols + cols[None, :], tile * 2)

    x = torch.randn(1024, 512, device="cuda", dtype=torch.float16)
    out = torch.full_like(x, float("nan"))
    descriptor = TensorDescriptor.from_tensor(x, block_shape=[64, 64])
    scale_tiles[(1024 // 64, 512 // 64)](descriptor, out, 512, BLOCK_M=64, BLOCK_N=64)
    torch.cuda.synchronize()
    assert torch.equal(out, x * 2)


@step("machete")
def _machete():
    import torch
    from w4a16_gemm import machete_operands, machete_run, reference

    torch.manual_seed(0)
    a, w_ref, operands = machete_operands(m=128, k=4096, n=4096)
    out = machete_run(a, operands)
    torch.cuda.synchronize()
    expected = reference(a, w_ref)
    error = ((out.float() - expected).norm() / expected.norm()).item()
    assert error < 1e-2, error
    return {"rel_error": error}


def counters():
    cuda = ctypes.CDLL("libcuda.so.1")
    out: dict[str, object] = {}
    if hasattr(cuda, "layer_calls"):
        cuda.layer_calls.restype = ctypes.c_longlong
        out["layer_calls"] = {
            n: cuda.layer_calls(n.encode())
            for n in (
                "cuGetProcAddress",
                "cuMemAlloc_v2",
                "cuMemAllocAsync",
                "cuLaunchKernel",
                "cuModuleLoadData",
                "cuCtxSynchronize",
                "cuStreamSynchronize",
                "cuMemcpyHtoDAsync_v2",
            )
        }
    if hasattr(cuda, "tmaguard_launch_counts"):
        counts = (ctypes.c_longlong * 3)()
        cuda.tmaguard_launch_counts(counts)
        out["launch_ex"] = dict(zip(("metered", "cooperative", "unmetered"), counts, strict=True))
    if hasattr(cuda, "tmaguard_shim_source"):
        out["encoder_source"] = cuda.tmaguard_shim_source(b"cuTensorMapEncodeTiled")
    with open("/proc/self/maps") as file:
        maps = file.read().splitlines()
    out["libcuda_files"] = sorted(
        {line.split()[-1] for line in maps if "libcuda" in line or "overlay" in line}
    )
    return out


def run_step(name: str) -> dict:
    """In this process: the guard (import vllm runs its hook unless TMAGUARD_MODE=off), then the step.
    TORCH_FIRST=1: torch initialises CUDA before vLLM is imported, as scripts and notebooks do."""
    try:
        if os.environ.get("TORCH_FIRST") == "1":
            import torch

            torch.zeros(1, device="cuda")
        import vllm  # noqa: F401

        result = {"ok": True, **(STEPS[name]() or {})}
    except BaseException as error:  # a failing step is a result here
        result = {
            "ok": False,
            "error": f"{type(error).__name__}: {error}"[:400],
            "where": traceback.format_exc().splitlines()[-3:],
        }
    result["counters"] = counters()
    return result


def main() -> None:
    if len(sys.argv) > 1:
        print("STEP " + json.dumps(run_step(sys.argv[1])), flush=True)
        return
    results: dict[str, object] = {"mode": os.environ.get("CHECK_MODE", "?")}
    for name in os.environ.get("CHECK_STEPS", ",".join(STEPS)).split(","):
        done = subprocess.run(
            [sys.executable, "-X", "faulthandler", __file__, name],
            capture_output=True,
            text=True,
            timeout=240,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("STEP ")]
        if lines:
            results[name] = json.loads(lines[-1][5:])
        else:
            results[name] = {
                "ok": False,
                "returncode": done.returncode,
                "error": "process died: " + " | ".join(done.stderr.strip().splitlines()[-6:])[:600],
            }
        sys.stderr.write(done.stderr[-4000:])
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
