"""The decision: a pure function of the facts and the toggles. What to supply and how, whether TMA is
usable, how to route vLLM's kernels, what stays broken, and why."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .facts import Facts
from .layers import ENCODERS
from .routing import Routing, RoutingInputs, route
from .routing_table import table_for
from .toggles import Toggles

PROC_ADDRESS_V2 = "cuGetProcAddress_v2"
LAUNCH_EX = "cuLaunchKernelEx"
MIN_TMA_CUDA_DRIVER = 12000  # TMA descriptors arrived with CUDA 12.0

# What breaks when a driver symbol no shim supplies is missing, by the module that needs it.
_FEATURE_OF_MODULE = {
    "vllm.cumem_allocator": "sleep mode and the CuMem allocator (--enable-sleep-mode)",
    "vllm._flashmla_C": "FlashMLA attention",
}
# Entry points looked up in libcuda.so.1's own handle, which an RTLD_GLOBAL shim cannot answer.
HANDLE_SCOPED = {
    PROC_ADDRESS_V2: "CUDA runtime 12+ (torch) looks it up in libcuda.so.1's handle",
    LAUNCH_EX: "Triton looks it up in libcuda.so.1's handle",
}
OVERLAY_GROUPS = {"encoders": ENCODERS, "proc-address": (PROC_ADDRESS_V2,), "launch-ex": (LAUNCH_EX,)}


@dataclass(frozen=True)
class Supply:
    library: str  # "overlay", or a shim library: "encoders", "proc-address"
    symbols: tuple[str, ...]  # the names it exports
    how: str  # how the calls reach a real implementation
    groups: frozenset[str] = frozenset()  # overlay: the feature groups of its variant
    fallback: tuple[str, ...] = ()  # overlay: shim libraries to load if the overlay cannot be loaded


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
    layer_path: str | None = None  # the file answering libcuda.so.1 (the overlay depends on it)
    unfixed: tuple[str, ...] = ()  # problems the guard cannot fix, each with its consequence
    tma: TmaVerdict | None = None
    routing: Routing | None = None

    @property
    def problem(self) -> str | None:
        """The cause strict mode stops on, if any: what the guard cannot fix, or user settings it overrode."""
        causes = list(self.unfixed) + list(self.routing.overrides if self.routing else ())
        return "; ".join(causes) if causes else None

    @property
    def fatal(self) -> str | None:
        """A cause that stops start-up even without strict mode: the user insisted on what cannot be had."""
        return self.routing.error if self.routing else None


def _network_layer(facts: Facts) -> str | None:
    """A layer serving a GPU over the network: no local driver behind it, whatever files the pod holds."""
    return next((layer.name for layer in facts.layers if not layer.forwards_to_local_driver), None)


def _real_driver(facts: Facts) -> str | None:
    """The real driver file the overlay's look-up may end at: none behind a network layer."""
    return facts.driver.real_driver if _network_layer(facts) is None else None


def _encoder(facts: Facts, supplied: set[str]) -> tuple[bool, str]:
    """Whether a real cuTensorMapEncodeTiled is reachable in this process, and from where (passive evidence
    only: what the layer exports, and a real driver file for the overlay's look-up to end at)."""
    name = ENCODERS[0]
    if facts.driver.exports(name):
        return True, f"{os.path.basename(facts.driver.path or '')} exports {name}"
    network = _network_layer(facts)
    if network is not None:
        return False, f"{network}: no local driver to forward {name} to"
    if name not in supplied:
        return False, f"libcuda.so.1 lacks {name} and the guard does not supply it"
    if facts.driver.real_driver is None:
        return False, (
            f"libcuda.so.1 lacks {name} and no real driver file was found (beside the layer, on the "
            "loader's paths, in the usual driver directories)"
        )
    return True, f"{name} {_encoder_route(facts)}"


def _tma_verdict(facts: Facts, encoder: tuple[bool, str]) -> TmaVerdict:
    hopper = [gpu for gpu in facts.gpu.gpus if gpu.compute_capability[0] == 9]
    if not hopper:
        found = ", ".join(sorted({f"{a}.{b}" for a, b in facts.gpu.capabilities()})) or "no GPU seen"
        return TmaVerdict(False, f"no sm_90 GPU ({found})")
    cuda = facts.gpu.cuda_driver_version
    if cuda is not None and cuda < MIN_TMA_CUDA_DRIVER:
        return TmaVerdict(
            False, f"the driver supports CUDA {cuda // 1000}.{cuda % 1000 // 10}; TMA needs 12.0"
        )
    return TmaVerdict(encoder[0], encoder[1])


def _encoder_route(facts: Facts) -> str:
    """Where the overlay and shims take the encoders from (csrc/tmaguard.h's order)."""
    real = _real_driver(facts)
    return f"from the real driver the layer loads ({real})" if real else "from nowhere: no real driver"


def _shims(facts: Facts, missing: dict[str, tuple[str, ...]]) -> list[Supply]:
    """RTLD_GLOBAL shims for what vLLM's extensions link against and the layer lacks."""
    supplies = []
    if any(symbol in missing for symbol in ENCODERS):
        supplies.append(Supply("encoders", ENCODERS, _encoder_route(facts)))
    if PROC_ADDRESS_V2 in missing:
        supplies.append(
            Supply(
                "proc-address",
                (PROC_ADDRESS_V2,),
                "built on the layer's own cuGetProcAddress, so its hooks stay in place",
            )
        )
    return supplies


def overlay_groups(facts: Facts) -> frozenset[str]:
    """The overlay's feature groups this layer needs: each group the layer's libcuda.so.1 lacks."""
    return frozenset(group for group, names in OVERLAY_GROUPS.items() if not facts.driver.exports(names[0]))


def _overlay_blocker(facts: Facts, toggles: Toggles) -> str | None:
    """Why the overlay cannot become this process's libcuda.so.1, or None if it can."""
    if toggles.overlay == "off":
        return "TMAGUARD_OVERLAY=off"
    if facts.driver.resolution.how == "mapped":
        return f"libcuda.so.1 ({facts.driver.path}) was already loaded when the guard ran"
    return None


def _supplies(
    facts: Facts, toggles: Toggles, missing: dict[str, tuple[str, ...]]
) -> tuple[list[Supply], list[str]]:
    """What to load, and what stays broken (handle-scoped gaps when the overlay cannot be used)."""
    shims = _shims(facts, missing)
    groups = overlay_groups(facts)
    if not groups:
        return shims, []
    blocker = _overlay_blocker(facts, toggles)
    if blocker is None:
        # The overlay carries every driver entry point of the CUDA 13 headers, each the layer's own export
        # where it has one: whatever the layer lacks is supplied.
        lacking = [s for group, names in OVERLAY_GROUPS.items() if group in groups for s in names]
        symbols = tuple(dict.fromkeys([*missing, *lacking]))
        how = (
            f"overlay libcuda.so.1 in front of {facts.driver.path}: the layer's own export of each exact "
            f"symbol, what it lacks from the real driver it loads; encoders {_encoder_route(facts)}; "
            "cuLaunchKernelEx through the layer's metered cuLaunchKernel where its attributes allow"
        )
        return [Supply("overlay", symbols, how, groups, tuple(s.library for s in shims))], []
    broken = [
        f"{symbol} is missing from libcuda.so.1's own handle: {why}, and a global shim cannot answer "
        f"that ({blocker}); fix it from the manifest: see `tmaguard env`"
        for symbol, why in HANDLE_SCOPED.items()
        if not facts.driver.exports(symbol)
    ]
    return shims, broken


def _routing(
    facts: Facts, toggles: Toggles, encoder: tuple[bool, str], tma: TmaVerdict, launch_ex: bool
) -> Routing:
    table, note = table_for(facts.vllm.version)
    return route(
        RoutingInputs(
            table=table,
            version_note=note,
            vllm_version=facts.vllm.version,
            capabilities=facts.gpu.capabilities(),
            encoder_reachable=encoder[0],
            encoder_reason=encoder[1],
            tma_usable=tma.usable,
            tma_reason=tma.reason,
            launch_ex=launch_ex,
            gemm=toggles.gemm,
            listed=facts.kernels_listed,
            environ=facts.environ,
        )
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

    missing = {
        symbol: modules for symbol, modules in facts.vllm.needs().items() if not driver.exports(symbol)
    }
    supplies, unfixed = _supplies(facts, toggles, missing)
    supplied = {symbol for supply in supplies for symbol in supply.symbols}
    for symbol, modules in missing.items():
        if symbol not in supplied:
            features = sorted({_FEATURE_OF_MODULE.get(m, m) for m in modules})
            unfixed.append(
                f"{symbol} is missing from {driver.path}: {', '.join(features)} will fail "
                "(not supplied: forwarding it around the layer would bypass its quota)"
            )

    encoder = _encoder(facts, supplied)
    tma = _tma_verdict(facts, encoder)
    routing = _routing(facts, toggles, encoder, tma, driver.exports(LAUNCH_EX) or LAUNCH_EX in supplied)

    layer = facts.layers[0].name if facts.layers else "no sharing layer"
    lacking = list(dict.fromkeys([*missing, *(OVERLAY_GROUPS[g][0] for g in sorted(overlay_groups(facts)))]))
    if lacking:
        verb = "supplying" if apply else "would supply"
        via = " with the overlay" if supplies and supplies[0].library == "overlay" else ""
        summary = (
            f"{layer}: libcuda.so.1 lacks {', '.join(lacking)}; {verb} {'them' if supplies else 'none'}{via}"
        )
    else:
        summary = f"{layer}: libcuda.so.1 has every entry point vLLM needs; nothing to load"
    level = "warning" if unfixed or routing.overrides or routing.hints or routing.error else "info"
    return Decision(
        level, summary, apply, tuple(supplies), _real_driver(facts), driver.path, tuple(unfixed), tma, routing
    )
