"""One check in one process, inside a pod (pod.sh): what a CUDA program and vLLM's kernels do under the pod's
sharing layer, with the guard installed and nothing else set. Prints `RESULT <json>`.

usage: check.py STEP [--vllm]   --vllm: `import vllm` first (its import hook runs the guard, as in a vLLM
process); without it the process imports torch only (the guard's torch-first hook, docs/design.md §2.7).
Steps: quota (what the process is shown, 1 GiB allowed, QUOTA_PROBE_GIB refused), bindings (which file
answers what the CUDA runtime binds), torch (fp32 matmul: cuBLAS), cublaslt (fp16 linear with bias:
cuBLASLt), half (fp16 and bf16 matmuls: cuBLAS), triton, triton_tma, machete (vLLM 0.25.1's W4A16 TMA
GEMM), guard (the guard alone, as a vLLM process runs it, without vLLM or CUDA: the record's summary and
what it cost)."""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
GIB = 1 << 30


def quota() -> dict:
    import torch

    free, total = torch.cuda.mem_get_info()
    shown = torch.cuda.get_device_properties(0).total_memory
    small = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    probe = int(os.environ.get("QUOTA_PROBE_GIB", "10"))
    try:
        big = torch.empty(probe * GIB, dtype=torch.uint8, device="cuda")
        refused, error = False, None
        del big
    except torch.OutOfMemoryError as oom:
        refused, error = True, str(oom).splitlines()[0][:200]
    del small
    return {
        "mem_get_info_gib": [round(free / GIB, 2), round(total / GIB, 2)],
        "total_memory_gib": round(shown / GIB, 2),
        f"alloc_{probe}_gib_refused": refused,
        "oom": error,
    }


def memory() -> dict:
    """What the layer counts inside its limit, stage by stage (issue 32): the device's used memory as
    cudaMemGetInfo shows it (total - free) and what PyTorch's allocator holds, after the CUDA context, a
    cuBLAS GEMM (its workspace), and a captured CUDA graph (its pool); NVML's view of the device beside it."""
    import torch

    stages: dict = {}

    def note(stage: str) -> None:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        stages[stage] = {
            "used_mib": round((total - free) / 2**20),
            "torch_reserved_mib": round(torch.cuda.memory_reserved() / 2**20),
            "total_mib": round(total / 2**20),
        }

    torch.zeros(1, device="cuda")
    note("context")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = a @ a
    note("cublas")
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            b = a @ a
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        b = a @ a + 1
    graph.replay()
    note("graph")
    del b
    result: dict = {"stages": stages}
    try:
        import pynvml

        pynvml.nvmlInit()
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
        result["nvml_mib"] = {"total": round(info.total / 2**20), "used": round(info.used / 2**20)}
    except Exception as error:  # NVML is not everywhere (and is the layer under vCUDA): a result too
        result["nvml_error"] = f"{type(error).__name__}: {error}"[:200]
    return result


def matmul() -> dict:
    import torch

    a = torch.randn(2048, 2048, device="cuda")
    product = a @ a
    reference = a.double() @ a.double()
    error = ((product.double() - reference).norm() / reference.norm()).item()
    assert error < 1e-4, error
    return {"rel_error": error}


def cublaslt() -> dict:
    import torch

    x = torch.randn(512, 1024, device="cuda", dtype=torch.float16)
    w = torch.randn(2048, 1024, device="cuda", dtype=torch.float16)
    b = torch.randn(2048, device="cuda", dtype=torch.float16)
    out = torch.nn.functional.linear(x, w, b)
    reference = x.float() @ w.float().t() + b.float()
    error = ((out.float() - reference).norm() / reference.norm()).item()
    assert error < 1e-2, error
    return {"rel_error": error}


def half() -> dict:
    """fp16 and bf16 matmuls through cuBLAS (torch's a @ b), each against float64."""
    import torch

    errors = {}
    for dtype in (torch.float16, torch.bfloat16):
        a = torch.randn(1024, 1024, device="cuda", dtype=dtype)
        b = torch.randn(1024, 1024, device="cuda", dtype=dtype)
        product = (a @ b).double()
        torch.cuda.synchronize()
        reference = a.double() @ b.double()
        errors[str(dtype).rsplit(".", 1)[1]] = ((product - reference).norm() / reference.norm()).item()
    assert max(errors.values()) < 1e-2, errors
    return {"rel_error": errors}


def triton_add() -> dict:
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
    return {}


def triton_tma() -> dict:
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
    return {}


def machete() -> dict:
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


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]  # fmt: skip


def bindings() -> dict:
    """Which file answers the entry points the CUDA runtime binds for torch (cudaGetDriverEntryPointByVersion
    with CUDA 13's version, as cudart does for itself): the layer, tmaguard's overlay or the real driver."""
    import torch

    torch.zeros(1, device="cuda")
    cudart = next(ctypes.CDLL(path) for path in where_calls_go()["mapped_cudart"])
    libc = ctypes.CDLL(None)
    files = {}
    for name in ("cuMemAlloc", "cuMemGetInfo", "cuLaunchKernel", "cuMemFree", "cuTensorMapEncodeTiled"):
        pointer, status = ctypes.c_void_p(), ctypes.c_int()
        cudart.cudaGetDriverEntryPointByVersion(
            name.encode(), ctypes.byref(pointer), 13000, ctypes.c_ulonglong(0), ctypes.byref(status)
        )
        info = _DlInfo()
        found = pointer.value and libc.dladdr(ctypes.c_void_p(pointer.value), ctypes.byref(info))
        files[name] = f"{info.fname.decode()}:{(info.sname or b'?').decode()}" if found else None
    return {"bound_in": files}


STEPS = {
    "bindings": bindings,
    "quota": quota,
    "memory": memory,
    "torch": matmul,
    "cublaslt": cublaslt,
    "half": half,
    "triton": triton_add,
    "triton_tma": triton_tma,
    "machete": machete,
    "guard": lambda: _guard(),
}


def _guard() -> dict:
    from vllm_tmaguard.guard import activate

    started = time.perf_counter()
    record = activate("device-check") or {}
    return {
        "guard_ms": round((time.perf_counter() - started) * 1e3, 2),
        **{
            k: record.get(k)
            for k in ("outcome", "summary", "actions", "problems", "elapsed_ms", "timings_ms", "tma")
        },
    }


def where_calls_go() -> dict:
    """The process's libcuda.so.1 and what it reports (tmaguard_shim_source: 3 real driver, 4 the layer's
    export, 5 tmaguard's own)."""
    out: dict = {}
    with open("/proc/self/maps") as file:
        lines = file.read().splitlines()
    out["mapped"] = sorted({line.split()[-1] for line in lines if "libcuda" in line or "vgpu" in line})
    out["mapped_cudart"] = sorted({line.split()[-1] for line in lines if "libcudart.so" in line})
    try:
        cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return out
    if hasattr(cuda, "tmaguard_shim_source"):
        names = (
            "cuMemAlloc_v2",
            "cuLaunchKernel",
            "cuLibraryLoadData",
            "cuTensorMapEncodeTiled",
            "cuLaunchKernelEx",
            "cuGetProcAddress_v2",
            "cuMemGetInfo_v2",
        )
        out["source"] = {n: cuda.tmaguard_shim_source(n.encode()) for n in names}
    if hasattr(cuda, "tmaguard_launch_counts"):
        counts = (ctypes.c_longlong * 3)()
        cuda.tmaguard_launch_counts(counts)
        out["launch_ex"] = list(counts)
    return out


def main() -> None:
    step, with_vllm = sys.argv[1], "--vllm" in sys.argv[2:]
    started = time.perf_counter()
    result: dict = {"step": step, "vllm": with_vllm, "pid": os.getpid()}
    try:
        if with_vllm:
            import vllm  # noqa: F401

            result["import_vllm_s"] = round(time.perf_counter() - started, 2)
        result.update({"ok": True, **STEPS[step]()})
    except BaseException as error:  # a failing step is a result
        result.update(ok=False, error=f"{type(error).__name__}: {error}"[:500])
        result["where"] = traceback.format_exc().splitlines()[-4:]
    result["calls"] = where_calls_go()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
