"""The decision: a pure function of the facts and the toggles. What to supply and how, whether TMA is
usable, what stays broken, and why."""

from __future__ import annotations

from dataclasses import dataclass

from .facts import Facts
from .layers import ENCODERS
from .toggles import Toggles

PROC_ADDRESS_V2 = "cuGetProcAddress_v2"
MIN_TMA_CUDA_DRIVER = 12000  # TMA descriptors arrived with CUDA 12.0

# What breaks when a driver symbol no shim supplies is missing, by the module that needs it.
_FEATURE_OF_MODULE = {
    "vllm.cumem_allocator": "sleep mode and the CuMem allocator (--enable-sleep-mode)",
    "vllm._flashmla_C": "FlashMLA attention",
}


@dataclass(frozen=True)
class Supply:
    library: str  # "encoders" or "proc-address": which of the package's shim libraries
    symbols: tuple[str, ...]  # the missing names it provides
    how: str  # how the calls reach a real implementation


@dataclass(frozen=True)
class TmaVerdict:
    usable: bool
    reason: str


@dataclass(frozen=True)
class Decision:
    level: str  # "debug" (no GPU: stay quiet), "info", "warning"
    summary: str
    apply: bool  # False in validate mode: say what would be done, do nothing
    supplies: tuple[Supply, ...] = ()
    real_driver: str | None = None
    unfixed: tuple[str, ...] = ()  # problems the guard cannot fix, each with its consequence
    tma: TmaVerdict | None = None
    warnings: tuple[str, ...] = ()

    @property
    def problem(self) -> str | None:
        """The cause strict mode stops on, if any."""
        return "; ".join(self.unfixed) if self.unfixed else None


def _tma_verdict(facts: Facts, encoder_forwarded: bool) -> TmaVerdict:
    hopper = sorted({gpu.compute_capability for gpu in facts.gpu.gpus if gpu.compute_capability[0] == 9})
    if not hopper:
        found = ", ".join(sorted({f"{a}.{b}" for a, b in facts.gpu.capabilities()})) or "no GPU"
        return TmaVerdict(False, f"no sm_90 GPU ({found}): vLLM's Hopper TMA kernels do not apply")
    cuda = facts.gpu.cuda_driver_version
    if cuda is not None and cuda < MIN_TMA_CUDA_DRIVER:
        return TmaVerdict(False, f"driver supports CUDA {cuda // 1000}.{cuda % 1000 // 10}, TMA needs 12.0")
    if facts.driver.exports(ENCODERS[0]):
        return TmaVerdict(True, f"{facts.driver.path} exports {ENCODERS[0]}")
    if encoder_forwarded:
        return TmaVerdict(True, f"{ENCODERS[0]} forwarded to the real driver {facts.driver.real_driver}")
    remote = [layer.name for layer in facts.layers if not layer.forwards_to_local_driver]
    if remote:
        return TmaVerdict(False, f"{remote[0]}: no local driver to forward {ENCODERS[0]} to")
    return TmaVerdict(
        False,
        f"no real {ENCODERS[0]} reachable: libcuda.so.1 lacks it and no real driver file was found beside it",
    )


def decide(facts: Facts, toggles: Toggles) -> Decision:
    apply = toggles.mode == "auto"
    driver = facts.driver
    if not facts.gpu.present and driver.path is None:
        return Decision(
            "debug", f"no GPU and no libcuda.so.1 ({facts.gpu.error or 'NVML: 0 devices'})", apply
        )
    if driver.path is None:
        searched = "; ".join(driver.resolution.skipped) or "LD_LIBRARY_PATH, ld.so.cache, default directories"
        problem = (
            f"libcuda.so.1 not found ({searched}): vLLM's CUDA extensions cannot load; mount the "
            "driver (NVIDIA container toolkit) or put its directory on LD_LIBRARY_PATH"
        )
        return Decision("warning", "libcuda.so.1 not found", apply, unfixed=(problem,))
    if driver.info is None:
        problem = f"{driver.path} is unreadable ({driver.error}): cannot tell what it exports"
        return Decision("warning", "libcuda.so.1 unreadable", apply, unfixed=(problem,))
    if not facts.vllm.found:
        return Decision("info", "vLLM is not installed: nothing to check", apply)

    needs = facts.vllm.needs()
    missing = {symbol: modules for symbol, modules in needs.items() if not driver.exports(symbol)}
    supplies: list[Supply] = []
    unfixed: list[str] = []
    forwarding_to_real = driver.real_driver is not None
    if any(symbol in missing for symbol in ENCODERS):
        how = (
            f"through the layer's cuGetProcAddress, else the real driver {driver.real_driver}"
            if forwarding_to_real
            else "through the layer's cuGetProcAddress"
        )
        supplies.append(Supply("encoders", ENCODERS, how))
    if PROC_ADDRESS_V2 in missing:
        supplies.append(
            Supply(
                "proc-address",
                (PROC_ADDRESS_V2,),
                "built on the layer's own cuGetProcAddress, so its hooks stay in place",
            )
        )
    supplied = {symbol for supply in supplies for symbol in supply.symbols}
    for symbol, modules in missing.items():
        if symbol not in supplied:
            features = sorted({_FEATURE_OF_MODULE.get(m, m) for m in modules})
            unfixed.append(
                f"{symbol} is missing from {driver.path}: {', '.join(features)} will fail "
                "(not supplied: forwarding it around the layer would bypass its quota)"
            )

    tma = _tma_verdict(facts, encoder_forwarded=forwarding_to_real and bool(supplies))
    warnings = []
    if not tma.usable and any(gpu.compute_capability[0] == 9 for gpu in facts.gpu.gpus):
        warnings.append(
            f"TMA is unusable on this sm_90 GPU ({tma.reason}); a TMA kernel (Machete, CUTLASS "
            "sm90, FlashAttention-3) would stop the process with an illegal instruction"
        )

    layer = facts.layers[0].name if facts.layers else "no sharing layer"
    if supplies:
        names = ", ".join(s for supply in supplies for s in supply.symbols if s in missing)
        summary = f"{layer}: libcuda.so.1 lacks {names}; {'supplying' if apply else 'would supply'} them"
    else:
        summary = f"{layer}: libcuda.so.1 has every entry point vLLM needs; nothing to load"
    level = "warning" if unfixed or warnings else "info"
    return Decision(
        level, summary, apply, tuple(supplies), driver.real_driver, tuple(unfixed), tma, tuple(warnings)
    )
