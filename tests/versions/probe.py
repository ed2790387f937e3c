"""Run as a child process inside a pod with one vLLM release's Python: resolves that release's CUDA platform
and asks its own kernel selectors what they pick, through whichever API the release has (located by
trying each release generation's import path, called with only the arguments its signature takes).

Usage: python probe.py [selectors] | tables TABLE_JSON (tests/test_routing.py runs it with -c: selectors).
Prints one line: RESULT {json}."""

import importlib
import inspect
import json
import os
import sys

# vLLM first, as in a vLLM process: its import runs the guard (.pth hook or platform plugin) before anything
# maps libcuda.so.1.
OUT: dict = {"pid": os.getpid()}  # its own guard record: helper processes it starts write theirs too


def first_module(*names: str):
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not name.startswith(error.name):
                raise
    return None


def call(function, *args, **kwargs):
    """`function` with the keyword arguments its signature takes (the releases add and drop parameters)."""
    accepted = inspect.signature(function).parameters
    return function(*args, **{k: v for k, v in kwargs.items() if k in accepted})


def build(cls, **fields):
    """A release's config dataclass from the fields it has (`has_g_idx` came and went)."""
    names = set(inspect.signature(cls).parameters)
    return cls(**{k: v for k, v in fields.items() if k in names})


def config_context():
    """The release's `set_current_vllm_config(VllmConfig())` where it has one: its FP8 kernels read it."""
    import contextlib

    config = importlib.import_module("vllm.config")
    if hasattr(config, "set_current_vllm_config"):
        return config.set_current_vllm_config(config.VllmConfig())
    return contextlib.nullcontext()


def resolve_platform() -> None:
    import vllm  # noqa: F401  (0.6.x imports its CUDA extension here)
    from vllm.platforms import current_platform

    OUT["platform"] = type(current_platform).__name__
    import torch

    OUT["ops"] = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("_C::"))


def mixed_precision(cc: int) -> str:
    import torch
    from vllm.scalar_type import scalar_types

    module = first_module(
        "vllm.model_executor.kernels.linear",  # 0.20+
        "vllm.model_executor.layers.quantization.kernels.mixed_precision",  # 0.8 - 0.15
        "vllm.model_executor.layers.quantization.kernels",  # 0.6
    )
    config = build(
        module.MPLinearLayerConfig,
        full_weight_shape=(4096, 4096),
        partition_weight_shape=(4096, 4096),
        weight_type=scalar_types.uint4b8,
        act_type=torch.float16,
        group_size=128,
        zero_points=False,
        has_g_idx=False,
    )
    return module.choose_mp_linear_kernel(config, compute_capability=cc).__name__


def fp8_per_tensor() -> str:
    """The class of the release's FP8 selector; before it had one (<= 0.11), what its FP8 linear op
    chooses by `cutlass_fp8_supported()`."""
    import torch

    module = first_module(
        "vllm.model_executor.kernels.linear", "vllm.model_executor.layers.quantization.kernels.scaled_mm"
    )
    if module is None or not hasattr(module, "init_fp8_linear_kernel"):
        from vllm.model_executor.layers.quantization.utils.w8a8_utils import cutlass_fp8_supported

        return "cutlass_scaled_mm" if cutlass_fp8_supported() else "torch._scaled_mm"
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8StaticTensorSym

    with config_context():
        kernel = call(
            module.init_fp8_linear_kernel,
            activation_quant_key=kFp8StaticTensorSym,
            weight_quant_key=kFp8StaticTensorSym,
            input_dtype=torch.bfloat16,
            out_dtype=torch.bfloat16,
            weight_shape=(4096, 4096),
        )
    return type(kernel).__name__


def fp8_block() -> str | None:
    """Block-FP8 (128x128) linear: the selector's class from 0.20; before, the CUTLASS block GEMM or not."""
    import torch

    module = first_module("vllm.model_executor.kernels.linear")
    if module is None:
        utils = first_module("vllm.model_executor.layers.quantization.utils.w8a8_utils")
        if not hasattr(utils, "cutlass_block_fp8_supported"):
            return None  # 0.6: block FP8 runs on Triton only
        return "cutlass_scaled_mm (block)" if utils.cutlass_block_fp8_supported() else "Triton"
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kFp8Dynamic128Sym,
        kFp8Static128BlockSym,
    )

    config = build(
        module.FP8ScaledMMLinearLayerConfig,
        weight_quant_key=kFp8Static128BlockSym,
        activation_quant_key=kFp8Dynamic128Sym,
        weight_shape=(4096, 4096),
        input_dtype=torch.bfloat16,
        out_dtype=torch.bfloat16,
    )
    with config_context():
        return call(
            module.choose_scaled_mm_linear_kernel,
            config,
            module._POSSIBLE_FP8_BLOCK_KERNELS,
            quantization="fp8_block_w8a8",
        ).__name__


def flash_attention() -> int | None:
    """The release's own choice of FlashAttention version; None where it has no FA3 at all (0.6)."""
    module = first_module("vllm.v1.attention.backends.fa_utils", "vllm.attention.utils.fa_utils")
    if module is None:
        return None
    interface = importlib.import_module("vllm.vllm_flash_attn.flash_attn_interface")
    OUT["fa3_available"] = bool(getattr(interface, "FA3_AVAILABLE", False))
    if "torch.cuda.get_device_capability" in inspect.getsource(interface):
        # 0.8 - 0.15 ask the CUDA runtime for the capability; this machine has no GPU for it to reach, so
        # the answer comes from the release's own NVML-based platform (the pod's stand-in NVML).
        import torch
        from vllm.platforms import current_platform

        torch.cuda.get_device_capability = lambda device=None: tuple(current_platform.get_device_capability())
    with config_context():
        return module.get_flash_attn_version()


def selectors() -> None:
    resolve_platform()
    from vllm.platforms import current_platform

    cc = current_platform.get_device_capability().to_int()
    OUT["cc"] = cc
    OUT["w4a16"] = mixed_precision(cc)
    OUT["fp8"] = fp8_per_tensor()
    OUT["fp8_block"] = fp8_block()
    OUT["fa"] = flash_attention()
    OUT["env"] = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}


def tables(table: dict) -> None:
    """What the release has of the routing table's names: classes in its selector module, knobs in its
    envs.py, extension modules in its wheel, command-line flags in its engine arguments."""
    resolve_platform()
    import vllm.envs

    classes = set()
    for path in table["listed_in"]:
        module = "vllm." + path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        classes |= {n for n, v in vars(importlib.import_module(module)).items() if isinstance(v, type)}
    OUT["classes"] = sorted(classes)
    OUT["knobs"] = sorted(vllm.envs.environment_variables)
    OUT["modules"] = {name: module_exists(name) for name in table["modules"]}
    arguments = inspect.getsource(importlib.import_module("vllm.engine.arg_utils"))
    OUT["flags"] = {
        flag: flag in arguments or flag[2:].replace("-", "_") in arguments for flag in table["flags"]
    }


def module_exists(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def main() -> None:
    try:
        if sys.argv[1:2] == ["tables"]:
            tables(json.loads(sys.argv[2]))
        else:
            selectors()
    except Exception as error:
        OUT["error"] = f"{type(error).__name__}: {error}"
    print("RESULT " + json.dumps(OUT))


main()
