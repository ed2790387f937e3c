"""W4A16 (GPTQ uint4b8, group 128, fp16 activations) GEMM with vLLM 0.25.1's own ops on a Hopper device:
Machete (TMA, sm_90a), Marlin (cp.async) and fp16 cuBLAS, over Llama-3 8B/70B layer shapes. Weights are
quantised and packed here in the GPTQ layout; Marlin's layout comes from vLLM's gptq_marlin_repack op and
Machete's from machete_prepack_B, as vLLM does when it loads a checkpoint. Every kernel's output is checked
against the dequantised reference before it is timed. Prints one JSON line.

usage: w4a16_gemm.py [--shapes all|quick] [--kernels machete,marlin,cublas]"""

from __future__ import annotations

import argparse
import importlib
import json

# vLLM first, as in a vLLM process: its import runs the guard, which must put the overlay in place before
# anything maps libcuda.so.1, and on the device `import torch` already does (measured, torch 2.11).
importlib.import_module("vllm")
import torch  # noqa: E402

GROUP = 128
SHAPES = {  # (K, N) of Llama-3 layers at tensor-parallel 1
    "8B qkv": (4096, 6144),
    "8B o": (4096, 4096),
    "8B gate_up": (4096, 28672),
    "8B down": (14336, 4096),
    "70B qkv": (8192, 10240),
    "70B o": (8192, 8192),
    "70B gate_up": (8192, 57344),
    "70B down": (28672, 8192),
}
TOKENS = (1, 16, 32, 64, 128, 256, 512, 1024, 4096)


def quantize(k: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Symmetric 4-bit, bias 8 (uint4b8), one fp16 scale per 128 rows of K: (dequantised w, q, scales)."""
    w = torch.randn(k // GROUP, GROUP, n, device="cuda", dtype=torch.float32) / k**0.5
    scales = (w.abs().amax(dim=1, keepdim=True) / 7).clamp(min=1e-6).half().float()
    q = (torch.round(w / scales).clamp(-8, 7) + 8).to(torch.int32)
    w_ref = ((q - 8).float() * scales).reshape(k, n).half()
    return w_ref, q.reshape(k, n), scales.reshape(k // GROUP, n).half()


def pack_rows(q: torch.Tensor) -> torch.Tensor:
    """GPTQ packing: eight 4-bit values along K per int32 (vLLM's quant_utils.pack_rows, on the GPU)."""
    k, n = q.shape
    rows = q.to(torch.int64).reshape(k // 8, 8, n)
    packed = torch.zeros(k // 8, n, dtype=torch.int64, device=q.device)
    for i in range(8):
        packed |= (rows[:, i, :] & 0xF) << (4 * i)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def reference(a: torch.Tensor, w_ref: torch.Tensor) -> torch.Tensor:
    return a.float() @ w_ref.float()


def machete_operands(m: int, k: int, n: int):
    import vllm._custom_ops as ops
    from vllm.scalar_type import scalar_types

    w_ref, q, scales = quantize(k, n)
    column_major = pack_rows(q).t().contiguous().t()
    b = ops.machete_prepack_B(column_major, torch.float16, scalar_types.uint4b8, torch.float16)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    return a, w_ref, (b, scales)


def machete_run(a: torch.Tensor, operands) -> torch.Tensor:
    import vllm._custom_ops as ops
    from vllm.scalar_type import scalar_types

    b, scales = operands
    return ops.machete_mm(a=a, b_q=b, b_type=scalar_types.uint4b8, b_group_scales=scales, b_group_size=GROUP)


def _scale_perm() -> list[int]:
    # vLLM 0.25.1 marlin_utils.get_scale_perms()[0]
    return [i + 8 * j for i in range(8) for j in range(8)]


def marlin_operands(q: torch.Tensor, scales: torch.Tensor):
    import vllm._custom_ops as ops

    k, n = q.shape
    empty = torch.empty(0, dtype=torch.int, device="cuda")
    weight = ops.gptq_marlin_repack(pack_rows(q), empty, k, n, 4)
    permuted = scales.reshape(-1, 64)[:, _scale_perm()].reshape(-1, n).contiguous()
    workspace = torch.zeros(
        torch.cuda.get_device_properties(0).multi_processor_count, dtype=torch.int, device="cuda"
    )
    return weight, permuted, empty, workspace


def marlin_run(a: torch.Tensor, operands, n: int) -> torch.Tensor:
    import vllm._custom_ops as ops
    from vllm.scalar_type import scalar_types

    weight, scales, empty, workspace = operands
    return ops.marlin_gemm(
        a,
        None,
        weight,
        None,
        scales,
        None,
        None,
        None,
        empty,
        empty,
        workspace,
        scalar_types.uint4b8,
        size_m=a.shape[0],
        size_n=n,
        size_k=a.shape[1],
        is_k_full=True,
        use_atomic_add=False,
        use_fp32_reduce=True,
        is_zp_float=False,
    )


def bench_shape(name: str, k: int, n: int, kernels: list[str], tokens: list[int]):
    """Times each kernel at each token count on one layer shape, after checking its output."""
    import triton.testing

    w_ref, q, scales = quantize(k, n)
    machete = None
    if "machete" in kernels:
        import vllm._custom_ops as ops
        from vllm.scalar_type import scalar_types

        column_major = pack_rows(q).t().contiguous().t()
        packed = ops.machete_prepack_B(column_major, torch.float16, scalar_types.uint4b8, torch.float16)
        machete = (packed, scales)
    marlin = marlin_operands(q, scales) if "marlin" in kernels else None
    timings, errors = [], {}
    for m in tokens:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        expected = reference(a, w_ref)
        runs = {
            "machete": (lambda a=a: machete_run(a, machete)) if machete else None,
            "marlin": (lambda a=a: marlin_run(a, marlin, n)) if marlin else None,
            "cublas": (lambda a=a: a @ w_ref) if "cublas" in kernels else None,
        }
        for kernel, run in runs.items():
            if run is None:
                continue
            error = ((run().float() - expected).norm() / expected.norm()).item()
            errors[f"{name} m={m} {kernel}"] = error
            if not error < 2e-2:
                raise AssertionError(f"{kernel} {name} m={m}: relative error {error}")
            us = triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median") * 1e3
            timings.append({"shape": name, "k": k, "n": n, "m": m, "kernel": kernel, "us": us})
    return timings, errors


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="all")
    parser.add_argument("--kernels", default="machete,marlin,cublas")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = parser.parse_args()
    shapes = SHAPES if args.shapes == "all" else {s: SHAPES[s] for s in ("8B o", "70B gate_up")}
    torch.manual_seed(0)
    timings, errors = [], {}
    for name, (k, n) in shapes.items():
        shape_timings, shape_errors = bench_shape(
            name, k, n, args.kernels.split(","), [int(t) for t in args.tokens.split(",")]
        )
        timings += shape_timings
        errors.update(shape_errors)
        torch.cuda.empty_cache()
    print(
        "RESULT "
        + json.dumps(
            {
                "device": torch.cuda.get_device_name(),
                "timings": timings,
                "max_rel_error": max(errors.values()),
            }
        )
    )


if __name__ == "__main__":
    main()
