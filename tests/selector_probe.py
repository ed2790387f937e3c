"""Run as a child process inside a pod: asks vLLM 0.32.0's real selectors which kernels they pick."""

import importlib
import json

# vLLM first, as in a vLLM process: its import runs the guard, which must load the overlay before anything
# maps libcuda.so.1 (importing torch does: it asks NVML, and nvmlInit loads libcuda.so.1).
importlib.import_module("vllm")

out = {"pid": __import__("os").getpid()}  # its own record: helpers it starts write theirs too
try:
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.kernels.linear import (
        _POSSIBLE_FP8_BLOCK_KERNELS,
        FP8ScaledMMLinearLayerConfig,
        MPLinearLayerConfig,
        choose_mp_linear_kernel,
        choose_scaled_mm_linear_kernel,
        init_fp8_linear_kernel,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kFp8Dynamic128Sym,
        kFp8Static128BlockSym,
        kFp8StaticTensorSym,
    )
    from vllm.platforms import current_platform
    from vllm.scalar_type import scalar_types
    from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

    cc = current_platform.get_device_capability().to_int()
    mp = MPLinearLayerConfig(
        full_weight_shape=(4096, 4096),
        partition_weight_shape=(4096, 4096),
        weight_type=scalar_types.uint4b8,
        act_type=torch.float16,
        group_size=128,
        zero_points=False,
    )
    out["w4a16"] = choose_mp_linear_kernel(mp, compute_capability=cc).__name__
    with set_current_vllm_config(VllmConfig()):
        out["fp8"] = type(
            init_fp8_linear_kernel(
                activation_quant_key=kFp8StaticTensorSym,
                weight_quant_key=kFp8StaticTensorSym,
                input_dtype=torch.bfloat16,
                out_dtype=torch.bfloat16,
                weight_shape=(4096, 4096),
            )
        ).__name__
        block = FP8ScaledMMLinearLayerConfig(
            weight_quant_key=kFp8Static128BlockSym,
            activation_quant_key=kFp8Dynamic128Sym,
            weight_shape=(4096, 4096),
            input_dtype=torch.bfloat16,
            out_dtype=torch.bfloat16,
        )
        out["fp8_block"] = choose_scaled_mm_linear_kernel(
            block, _POSSIBLE_FP8_BLOCK_KERNELS, quantization="fp8_block_w8a8"
        ).__name__
        out["fa"] = get_flash_attn_version()
    import os

    out["env"] = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
except Exception as error:
    out["error"] = f"{type(error).__name__}: {error}"
print("RESULT " + json.dumps(out))
