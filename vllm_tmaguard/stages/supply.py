"""What to supply: a pure function of the file facts and the toggles (no GPU facts). Which entry points
vLLM's extensions and the handle-scoped consumers need that libcuda.so.1 lacks, how to supply them (the
overlay, or shims where the overlay cannot be had), whether a real encoder is reached, and what stays
broken (docs/design.md §2)."""

import os

from ..codes import (
    DRIVER_MISSING,
    DRIVER_UNREADABLE,
    FOUND_MAPPED,
    HANDLE_SCOPED_GAP,
    LOOKUP_SWAPPED,
    SYMBOL_UNSUPPLIED,
)
from .catalogue import ENCODERS, HANDLE_SCOPED, LAUNCH_EX, OVERLAY_TRIGGERS, PROC_ADDRESS_V2, SHIM_SYMBOLS
from .facts import Facts
from .layers import SWAPS_LOOKUPS, Layer
from .outcomes import Problem
from .toggles import Toggles
from .values import value_type

# What breaks when a driver symbol nothing supplies is missing, by the module that needs it.
_FEATURE_OF_MODULE = {
    "vllm.cumem_allocator": "sleep mode and the CuMem allocator (--enable-sleep-mode)",
    "vllm._flashmla_C": "FlashMLA attention",
}

# Status values.
NO_DRIVER = "no-driver"  # nothing answers libcuda.so.1
UNREADABLE = "unreadable"
NO_VLLM = "no-vllm"
COMPLETE = "complete"  # libcuda.so.1 has everything
LACKING = "lacking"  # libcuda.so.1 lacks entry points (supplied or not: see supplies and problems)


@value_type
class Supply:
    library: str  # "overlay", or a shim library of catalogue.SHIM_FILES
    symbols: tuple[str, ...]  # the lacking names it answers
    fallback: tuple[str, ...] = ()  # overlay: the shims to load if the overlay cannot be loaded


@value_type
class Reach:
    """Whether a real cuTensorMapEncodeTiled is reachable in this process, and from where."""

    reachable: bool
    reason: str


@value_type
class SupplyPlan:
    status: str
    layer: Layer | None  # the layer that owns libcuda.so.1, if any
    lacking: tuple[str, ...] = ()  # what libcuda.so.1 lacks: vLLM's needs, then the overlay's triggers
    missing: dict[str, tuple[str, ...]] | None = None  # vLLM's needs it lacks -> the modules needing them
    supplies: tuple[Supply, ...] = ()
    encoder: Reach = Reach(False, "not examined")
    launch_ex: bool = False  # cuLaunchKernelEx answers (the layer's or supplied)
    real_driver: str | None = None  # the real driver the layer loads, where one is reached
    blocker: str | None = None  # why the overlay cannot become libcuda.so.1 (None: it can, or is not needed)
    problems: tuple[Problem, ...] = ()
    replaced: tuple[str, ...] = ()  # the layer's own exports the overlay answers instead (its look-ups)

    @property
    def supplied(self) -> dict[str, str]:
        return {symbol: supply.library for supply in self.supplies for symbol in supply.symbols}


def _network_layer(facts: Facts) -> str | None:
    """A layer serving a GPU over the network: no local driver behind it, whatever files the pod holds."""
    return next((layer.name for layer in facts.layers if not layer.forwards_to_local_driver), None)


def _encoder(facts: Facts, supplied: set[str]) -> Reach:
    """Passive evidence only: what the layer exports, and a real driver file the layer loads."""
    name, driver = ENCODERS[0], facts.driver
    network = _network_layer(facts)
    if driver.exports(name) and driver.overlay_of is None and network:
        return Reach(True, f"{network} forwards {name} to its server (a round trip per encode)")
    if driver.exports(name) and driver.overlay_of is None:
        return Reach(True, f"{os.path.basename(driver.path or '')} exports {name}")
    if network:
        return Reach(False, f"{network}: no local driver to forward {name} to")
    if name not in supplied and driver.overlay_of is None:
        return Reach(False, f"libcuda.so.1 lacks {name} and the guard does not supply it")
    if driver.real_driver is None:
        return Reach(
            False,
            f"libcuda.so.1 lacks {name} and no real driver file was found (beside the layer, on the loader's "
            "paths, in the usual driver directories)",
        )
    return Reach(True, f"{name} from the real driver the layer loads ({driver.real_driver})")


# The look-ups a vCUDA build answers by swapping in its hooks by base name (docs/design.md §2.4).
LOOKUPS = ("cuGetProcAddress", PROC_ADDRESS_V2)


def swapped_lookups(facts: Facts) -> tuple[str, ...]:
    """The look-ups of a vCUDA build that answers libcuda.so.1 itself (not behind this package's overlay):
    they hand cudart the layer's legacy-ABI hooks, so the overlay must answer them whatever else the layer
    exports."""
    driver = facts.driver
    layer = facts.layers[0] if facts.layers else None
    if layer is None or layer.name not in SWAPS_LOOKUPS or driver.overlay_of or driver.info is None:
        return ()
    return tuple(name for name in LOOKUPS if name in driver.info.defined)


def _swap_problem(facts: Facts, blocker: str) -> Problem:
    return Problem(
        LOOKUP_SWAPPED,
        cause=f"{blocker}, so the overlay cannot stand in: libcuda.so.1's own {PROC_ADDRESS_V2} (a vCUDA "
        "build) hands the CUDA runtime the layer's legacy-ABI hooks (cuMemAlloc for cuMemAlloc_v2)",
        consequence="every CUDA runtime allocation fails with CUDA_ERROR_INVALID_CONTEXT (201): torch and "
        "vLLM cannot use the GPU",
        fix="put the overlay first on LD_LIBRARY_PATH from the manifest: see `tmaguard env`",
        symbol=PROC_ADDRESS_V2,
        subject=facts.driver.path,
    )


def _overlay_blocker(facts: Facts, toggles: Toggles) -> str | None:
    if toggles.overlay == "off":
        return "TMAGUARD_OVERLAY=off"
    if facts.driver.resolution.how == FOUND_MAPPED:
        return "libcuda.so.1 was already loaded when the guard ran"
    return None


def _shims(missing: dict[str, tuple[str, ...]]) -> list[Supply]:
    """RTLD_GLOBAL shims for what vLLM's extensions bind and the layer lacks."""
    return [
        Supply(library, tuple(s for s in symbols if s in missing))
        for library, symbols in SHIM_SYMBOLS.items()
        if any(s in missing for s in symbols)
    ]


def plan_supply(facts: Facts, toggles: Toggles) -> SupplyPlan:
    """What to supply for the libcuda.so.1 this process gets: one of the house's two central pure functions
    (with routing.route), no file read and nothing loaded. Its decisions, in order, each final:
      1. no libcuda.so.1 found: DRIVER_MISSING; unreadable: DRIVER_UNREADABLE; no vLLM: nothing to do;
      2. nothing lacking (every symbol vLLM's extensions need, every overlay trigger exported) and no vCUDA
         look-up swapped: COMPLETE, with the encoder reached;
      3. else the overlay where it can stand in (libcuda.so.1 not loaded yet, TMAGUARD_OVERLAY not off),
         carrying every entry point; or else the per-symbol shims, with HANDLE_SCOPED_GAP
         for what a global shim cannot answer and LOOKUP_SWAPPED where a fork's look-up hands out old ABIs;
      4. SYMBOL_UNSUPPLIED for each needed symbol nothing supplies;
      5. the encoder: the real driver's cuTensorMapEncode* reached through what is supplied, or none (then
         routing keeps vLLM off TMA kernels).
    docs/design.md §2.4-2.6."""
    driver = facts.driver
    layer = facts.layers[0] if facts.layers else None
    if driver.path is None:
        searched = "; ".join(driver.resolution.skipped) or "LD_LIBRARY_PATH, ld.so.cache, default directories"
        problem = Problem(
            DRIVER_MISSING,
            cause=f"libcuda.so.1 not found ({searched})",
            consequence="vLLM's CUDA extensions cannot load",
            fix="mount the driver (NVIDIA container toolkit) or put its directory on LD_LIBRARY_PATH",
        )
        return SupplyPlan(NO_DRIVER, layer, problems=(problem,))
    if driver.info is None:
        problem = Problem(
            DRIVER_UNREADABLE,
            cause=f"{driver.path} is unreadable ({driver.error})",
            consequence="what it exports cannot be told, so nothing is supplied for it",
            fix="check the file's permissions and integrity (the NVIDIA container toolkit mounts it)",
            subject=driver.path,
        )
        return SupplyPlan(UNREADABLE, layer, problems=(problem,))
    if not facts.vllm.found:
        return SupplyPlan(NO_VLLM, layer)

    missing = {
        symbol: modules for symbol, modules in facts.vllm.needs().items() if not driver.exports(symbol)
    }
    triggers = tuple(name for name in OVERLAY_TRIGGERS if not driver.exports(name))
    lacking = tuple(dict.fromkeys([*missing, *triggers]))
    swapped = swapped_lookups(facts)
    if not lacking and not swapped:
        encoder = _encoder(facts, set())
        return SupplyPlan(COMPLETE, layer, encoder=encoder, launch_ex=True, real_driver=driver.real_driver)

    blocker = _overlay_blocker(facts, toggles) if triggers or swapped else None
    shims = _shims(missing)
    problems: list[Problem] = []
    if (triggers or swapped) and blocker is None:
        # The overlay carries every driver entry point of the CUDA 13 headers (the layer's own export of each
        # exact symbol where it has one): whatever the layer lacks is supplied, and a vCUDA build's look-ups
        # are answered by the overlay's own (exact ABIs, the layer's metered export of each).
        supplies = [Supply("overlay", lacking, tuple(s.library for s in shims))]
    else:
        supplies = shims
        if blocker is not None and PROC_ADDRESS_V2 in swapped:  # the CUDA 12 forks: cudart uses it
            problems.append(_swap_problem(facts, blocker))
        swapped = ()  # nothing answers them instead
        problems += [
            Problem(
                HANDLE_SCOPED_GAP,
                cause=f"{blocker}, so the overlay cannot stand in: libcuda.so.1's own handle lacks {symbol}",
                consequence=f"{why}, and a global shim cannot answer that",
                fix="put the overlay first on LD_LIBRARY_PATH from the manifest: see `tmaguard env`",
                symbol=symbol,
                subject=facts.driver.path,
            )
            for symbol, why in HANDLE_SCOPED.items()
            if symbol in triggers
        ]
    supplied = {symbol for supply in supplies for symbol in supply.symbols}
    problems += [
        Problem(
            SYMBOL_UNSUPPLIED,
            cause=f"{symbol} is missing from {driver.path}",
            consequence=f"{', '.join(sorted({_FEATURE_OF_MODULE.get(m, m) for m in modules}))} will fail",
            fix="use a build of the layer that exports it",
            symbol=symbol,
        )
        for symbol, modules in missing.items()
        if symbol not in supplied
    ]
    encoder = _encoder(facts, supplied)
    return SupplyPlan(
        LACKING if lacking else COMPLETE,
        layer,
        lacking,
        missing,
        tuple(supplies),
        encoder,
        LAUNCH_EX in supplied or driver.exports(LAUNCH_EX),
        driver.real_driver if encoder.reachable else None,
        blocker,
        tuple(problems),
        swapped,
    )
