"""Routing: which of vLLM's kernel paths to steer away from, through vLLM's own knobs. A pure function of
the installed vLLM's table, the GPUs, whether a real encoder is reachable, and the user's settings."""

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..codes import ROUTING_IMPOSSIBLE, ROUTING_OVERRIDE
from . import ray_env
from .outcomes import Problem
from .routing_table import (
    ATTENTION,
    KERNELS,
    MIXED_PRECISION,
    MIXED_PRECISION_TMA,
    MOE,
    SCALED_MM,
    SCALED_MM_CUTLASS,
    TABLES,
    VersionTable,
    table_for,
)
from .supply import COMPLETE, LACKING
from .values import value_type

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .facts import Facts
    from .gpu import GpuFacts
    from .layers import Layer
    from .supply import SupplyPlan

DISABLED_KERNELS = "VLLM_DISABLED_KERNELS"
# Every environment variable route() reads: the user's settings it merges with or overrides.
ENV_NAMES = tuple(
    dict.fromkeys(
        [DISABLED_KERNELS, *(v for t in TABLES for v in (*t.deep_gemm_off, t.flash_attn_env) if v)]
    )
)
ENV_NAMES += ray_env.ENV_NAMES  # the variables that carry the toggles to Ray workers (ray_env.carry)


@value_type
class RoutingInputs:
    table: VersionTable
    version_note: str | None
    vllm_version: str | None
    capabilities: frozenset[tuple[int, int]]  # empty: NVML could not tell
    encoder_reachable: bool
    encoder_reason: str
    tma_usable: bool  # sm_90, a new enough driver and a reachable encoder
    tma_reason: str
    launch_ex: bool  # libcuda.so.1 (or what the guard adds) has cuLaunchKernelEx
    gemm: str  # TMAGUARD_GEMM
    listed: frozenset[str] | None  # kernel names the installed vLLM's selector file lists; None: unreadable
    environ: Mapping[str, str]
    round_trips: str | None = None  # why each driver call costs a network round trip and nothing hides it


@value_type
class FamilyRoute:
    family: str
    path: str  # the path vLLM will take
    why: str


@value_type
class Override:
    """A user setting the guard replaced."""

    variable: str
    was: str
    now: str
    why: str


@value_type
class Routing:
    env: dict[str, str]  # variables to set, with their final values
    block_modules: tuple[str, ...]  # extension modules to make unimportable (vLLM then falls back itself)
    disabled: tuple[tuple[str, str], ...]  # (kernel class, why)
    families: tuple[FamilyRoute, ...]
    overrides: tuple[Override, ...]  # user settings the guard overrode
    hints: tuple[str, ...]  # TMA paths no knob reaches, with the command-line flag that does
    stale: tuple[str, ...]  # table knowledge the installed vLLM does not match
    error: str | None = None  # TMAGUARD_GEMM=hopper on a pod where TMA is unusable


def _majors(inputs: RoutingInputs) -> frozenset[int]:
    # Unknown GPU: route as if it could be any TMA architecture; a disabled kernel costs speed, a TMA kernel
    # without an encoder costs the process.
    return frozenset(m for m, _ in inputs.capabilities) or frozenset({9, 10, 12})


def _why_disabled(name: str, inputs: RoutingInputs, majors: frozenset[int]) -> str | None:
    kernel = KERNELS[name]
    uses_tma_here = bool(kernel.tma_majors & majors)
    if inputs.gemm == "portable" and uses_tma_here:
        return "TMAGUARD_GEMM=portable"
    if not inputs.encoder_reachable and uses_tma_here:
        return f"no real tensor-map encoder ({inputs.encoder_reason})"
    if kernel.sm90a_only and not inputs.table.gated_to_90 and any(m >= 10 for m in majors):
        return f"sm_90a-only code, and vLLM {inputs.vllm_version} does not limit it to compute capability 9.0"
    if kernel.needs_launch_ex and not inputs.launch_ex:
        return "libcuda.so.1 lacks cuLaunchKernelEx, which its launcher needs"
    if inputs.gemm == "latency" and kernel.latency_swap and 9 in majors:
        return "TMAGUARD_GEMM=latency: Marlin decodes one stream faster on sm_90 (docs/e2e-on-hopper.md)"
    if inputs.gemm == "auto" and inputs.round_trips and kernel.latency_swap and 9 in majors:
        return f"{inputs.round_trips}: Marlin's GEMM costs 2 round trips, Machete's 6-7 (docs/design.md §3.3)"
    return None


def round_trip_reason(layers: "Sequence[Layer]", eager: str | None) -> str | None:
    """Why each kernel launch costs a network round trip that CUDA graphs do not hide: a layer with no local
    driver (every call goes to its server) under a vLLM run eager. None otherwise."""
    remote = next((layer for layer in layers if not layer.forwards_to_local_driver), None)
    if remote is None or eager is None:
        return None
    return f"{remote.label} sends every driver call to its server and vLLM runs eager ({eager})"


def _merge_disabled(user_value: str, ours: list[str]) -> str | None:
    """The user's entries (kept, whitespace trimmed: vLLM matches names exactly) followed by ours."""
    user = [entry.strip() for entry in user_value.split(",") if entry.strip()]
    added = [name for name in ours if name not in user]
    return ",".join(user + added) if added else None


def route(inputs: RoutingInputs) -> Routing:
    """vLLM's knobs for this process: the house's other central pure function (with supply.plan_supply).
    Its decisions, in order:
      1. each kernel of vLLM's routing table disabled, first reason kept: it uses TMA here and
         TMAGUARD_GEMM=portable or no real encoder is reached; sm_90a-only code on a newer GPU vLLM does not
         gate; no cuLaunchKernelEx; Marlin's fewer round trips chosen (TMAGUARD_GEMM=latency, or auto with
         round trips said); merged into the user's VLLM_DISABLED_KERNELS, never removing a name;
      2. the guard's toggles carried to the Ray workers of a job this process starts (ray_env);
      3. DeepGEMM off on sm_90/sm_100 and FlashAttention-3 off on sm_90 (their modules' import blocked) where
         TMA is steered away from; a user's contrary setting is overridden and said (Override);
      4. TMAGUARD_GEMM=hopper with TMA unusable: an error (the strict stop);
      5. the path each kernel family then takes, the hints where vLLM has no knob, and a note where the
         installed vLLM lists kernels the table was not read from.
    docs/design.md §3."""
    table, environ = inputs.table, inputs.environ
    majors = _majors(inputs)
    steer_off_tma = inputs.gemm == "portable" or not inputs.encoder_reachable
    disabled = [(n, why) for n in table.kernels if (why := _why_disabled(n, inputs, majors))]
    env: dict[str, str] = {}
    overrides: list[Override] = []

    merged = _merge_disabled(environ.get(DISABLED_KERNELS, ""), [name for name, _ in disabled])
    if merged is not None:
        env[DISABLED_KERNELS] = merged
    env.update(ray_env.carry(environ))  # the toggles, to the Ray workers of a job this process starts

    def force(variable: str, value: str, why: str) -> None:
        current = environ.get(variable)
        if current is not None and current.strip() != value:
            overrides.append(Override(variable, current, value, why))
        if current is None or current.strip() != value:
            env[variable] = value

    deep_gemm_off = steer_off_tma and bool(majors & {9, 10})
    for variable in table.deep_gemm_off if deep_gemm_off else ():
        force(
            variable,
            "0",
            "DeepGEMM's kernels use TMA and no real encoder is reachable"
            if not inputs.encoder_reachable
            else "TMAGUARD_GEMM=portable",
        )
    fa3_off = steer_off_tma and 9 in majors
    if fa3_off and table.flash_attn_env:
        force(
            table.flash_attn_env,
            "2",
            "FlashAttention-3 uses TMA and no real encoder is reachable"
            if not inputs.encoder_reachable
            else "TMAGUARD_GEMM=portable",
        )
    blocked = tuple(m for m in (table.fa3_module, table.flashmla_module) if m and fa3_off)

    error = None
    if inputs.gemm == "hopper" and not inputs.tma_usable:
        error = (
            f"TMAGUARD_GEMM=hopper insists on Hopper TMA kernels, but TMA is unusable: {inputs.tma_reason}"
        )

    families = _families(inputs, majors, dict(disabled), deep_gemm_off, fa3_off)
    hints = table.no_knob if steer_off_tma and majors & {9, 10, 12} else ()
    stale = [
        f"{n} is not listed in the installed vLLM's {' or '.join(table.listed_in)}: routing knowledge read "
        f"from vLLM {table.read_from} may be stale"
        for n in table.kernels
        if inputs.listed is not None and n not in inputs.listed
    ]
    if inputs.version_note:
        stale.insert(0, inputs.version_note)
    return Routing(env, blocked, tuple(disabled), families, tuple(overrides), hints, tuple(stale), error)


def _families(
    inputs: RoutingInputs,
    majors: frozenset[int],
    disabled: dict[str, str],
    deep_gemm_off: bool,
    fa3_off: bool,
) -> tuple[FamilyRoute, ...]:
    """The path vLLM takes per family: the first kernel of vLLM's candidate order the guard left enabled."""

    def first_enabled(order: tuple[tuple[str, str], ...]) -> tuple[str, str] | None:
        present = [(n, label) for n, label in order if n in inputs.table.kernels]
        return next(((n, label) for n, label in present if n not in disabled), None)

    def why_disabled(names: tuple[str, ...]) -> str:
        return "; ".join(dict.fromkeys(f"{n}: {disabled[n]}" for n in names if n in disabled))

    routes = []
    mixed = tuple(name for name, _ in MIXED_PRECISION_TMA)
    chosen = first_enabled(MIXED_PRECISION_TMA)
    if 9 not in majors:
        gate = (
            "vLLM limits Machete and CUTLASS W4A8 to compute capability 9.0"
            if inputs.table.gated_to_90
            else why_disabled(mixed) or "Machete needs compute capability >= 9.0"
        )
        routes.append(FamilyRoute(MIXED_PRECISION, "Marlin (cp.async)", f"no sm_90 GPU; {gate}"))
    elif chosen:
        routes.append(
            FamilyRoute(MIXED_PRECISION, f"vLLM's choice: {chosen[1]} (sm_90 TMA)", inputs.tma_reason)
        )
    else:
        routes.append(FamilyRoute(MIXED_PRECISION, "Marlin (cp.async)", why_disabled(mixed)))

    cutlass = SCALED_MM_CUTLASS
    if not majors & {9, 10, 12}:
        routes.append(FamilyRoute(SCALED_MM, "vLLM's choice: CUTLASS 2.x / torch", "no TMA below sm_90"))
    elif cutlass not in inputs.table.kernels:
        routes.append(FamilyRoute(SCALED_MM, "CUTLASS 3.x (TMA)", "no knob in this vLLM version: see hints"))
    elif cutlass in disabled:
        routes.append(
            FamilyRoute(
                SCALED_MM,
                "torch._scaled_mm (cuBLASLt) / Triton / Marlin FP8",
                why_disabled(tuple(n for n in disabled if KERNELS[n].family == SCALED_MM)),
            )
        )
    else:
        routes.append(FamilyRoute(SCALED_MM, "vLLM's choice: CUTLASS 3.x (TMA)", inputs.encoder_reason))

    if deep_gemm_off:
        routes.append(
            FamilyRoute(
                MOE,
                "Triton / Marlin MoE; DeepGEMM off",
                "grouped-GEMM backends chosen by quantization have no knob: see hints",
            )
        )
    else:
        routes.append(
            FamilyRoute(
                MOE,
                "vLLM's choice",
                inputs.encoder_reason if majors & {9, 10} else "no TMA MoE kernel below sm_90",
            )
        )

    if inputs.table.fa3_module is None:
        routes.append(FamilyRoute(ATTENTION, "FlashAttention-2", "this vLLM version has no FlashAttention-3"))
    elif fa3_off:
        routes.append(
            FamilyRoute(
                ATTENTION,
                "FlashAttention-2",
                "FA3 (and FlashMLA) extension kept from importing, so vLLM falls back by itself",
            )
        )
    elif 9 in majors:
        routes.append(FamilyRoute(ATTENTION, "vLLM's choice: FlashAttention-3", inputs.tma_reason))
    else:
        routes.append(
            FamilyRoute(ATTENTION, "FlashAttention-2", "vLLM uses FA3 only on compute capability 9.x")
        )
    return tuple(routes)


MIN_TMA_CUDA_DRIVER = 12000  # TMA descriptors arrived with CUDA 12.0


@value_type
class TmaVerdict:
    usable: bool
    reason: str


@value_type
class RoutePlan:
    tma: TmaVerdict
    routing: Routing
    problems: tuple[Problem, ...]  # the user settings overridden, or insisted on and impossible


def tma_verdict(
    capabilities: frozenset[tuple[int, int]], cuda_version: int | None, encoder: tuple[bool, str]
) -> TmaVerdict:
    """Whether Hopper's TMA kernels can run here: an sm_90 GPU (or one of unknown model), a driver of CUDA
    12 or newer, and a reachable real encoder."""
    if capabilities and not any(major == 9 for major, _ in capabilities):
        found = ", ".join(sorted(f"{a}.{b}" for a, b in capabilities))
        return TmaVerdict(False, f"no sm_90 GPU ({found})")
    if cuda_version is not None and cuda_version < MIN_TMA_CUDA_DRIVER:
        return TmaVerdict(
            False,
            f"the driver supports CUDA {cuda_version // 1000}.{cuda_version % 1000 // 10}; TMA needs 12.0",
        )
    return TmaVerdict(*encoder)


def plan_routing_after(
    facts: "Facts", gpus: "GpuFacts", supply: "SupplyPlan", gemm: str
) -> "RoutePlan | None":
    """The routing stage on what the stages before it found; None where there is nothing to route (no
    libcuda.so.1, or no vLLM)."""
    if supply.status not in (COMPLETE, LACKING):
        return None
    encoder = (supply.encoder.reachable, supply.encoder.reason)
    return plan_routing(
        gpus.capabilities(), gpus.cuda_driver_version, encoder, supply.launch_ex, facts.vllm.version,
        facts.kernels_listed, gemm, facts.environ, round_trip_reason(facts.layers, facts.eager),
    )  # fmt: skip


def plan_routing(
    capabilities: frozenset[tuple[int, int]],
    cuda_version: int | None,
    encoder: tuple[bool, str],
    launch_ex: bool,
    vllm_version: str | None,
    listed: frozenset[str] | None,
    gemm: str,
    environ: Mapping[str, str],
    round_trips: str | None = None,
) -> RoutePlan:
    """How to steer vLLM's kernels: the TMA verdict and route(), with the settings it overrides as problems.
    `capabilities`: the GPUs' (empty: unknown, routed as if any TMA architecture)."""
    tma = tma_verdict(capabilities, cuda_version, encoder)
    table, note = table_for(vllm_version)
    routing = route(
        RoutingInputs(
            table, note, vllm_version, capabilities, encoder[0], encoder[1], tma.usable, tma.reason,
            launch_ex, gemm, listed, environ, round_trips,
        )
    )  # fmt: skip
    problems = [
        Problem(
            ROUTING_OVERRIDE,
            cause=f"{o.variable}={o.was} overridden to {o.now}: {o.why}",
            consequence="the setting is not in effect",
            fix=f"unset {o.variable}, or give the pod a real tensor-map encoder",
            subject=o.variable,
        )
        for o in routing.overrides
    ]
    if routing.error:
        problems.append(
            Problem(
                ROUTING_IMPOSSIBLE,
                cause=routing.error,
                consequence="start-up stops: the insisted kernels would crash without an encoder",
                fix="set TMAGUARD_GEMM=auto (or portable) to let the guard route around it",
                subject="TMAGUARD_GEMM",
            )
        )
    return RoutePlan(tma, routing, tuple(problems))
