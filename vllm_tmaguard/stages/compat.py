"""vLLM's own CUDA forward-compatibility switch against a layer that replaces libcuda.so.1 (docs/design.md
§2.14). With VLLM_ENABLE_CUDA_COMPATIBILITY=1, `import vllm` (vllm/env_override.py, before torch) puts the
CUDA compat directory first on LD_LIBRARY_PATH; every child vLLM starts with a fresh loader (the EngineCore,
its workers) then loads NVIDIA's compat libcuda.so.1 from it and never the layer's: the quota is off there
(measured under vCUDA master: 78.55 GiB shown, 10 GiB past an 8 GiB quota allocated). The guard runs at
`import vllm` before env_override, so it can keep the switch off; and a process whose libcuda.so.1 is not
the layer's in a pod whose vCUDA quota is configured is said to be outside the layer, never "no sharing
layer". Pure functions of the environment, the layers found and the quota read."""

from collections.abc import Mapping

from ..codes import COMPAT_BYPASSES_LAYER, LAYER_BYPASSED
from .outcomes import Problem
from .values import value_type

SWITCH = "VLLM_ENABLE_CUDA_COMPATIBILITY"
DIRECTORY = "VLLM_CUDA_COMPATIBILITY_PATH"
ENV_NAMES = (SWITCH, DIRECTORY, "CONDA_PREFIX")  # what env_override reads to pick the directory
# Layers that are the process's libcuda.so.1: a compat libcuda.so.1 found first on the path replaces them.
BYPASSED = "bypassed"  # a layer's condition: configured in the pod, not the process's libcuda.so.1
# vCUDA configured for the pod but not this process's libcuda.so.1: a layer name of its own, so that nothing
# that acts on a vCUDA build (the overlay's look-ups, its metering, its quota) takes it for one.
BYPASSED_VCUDA = "vcuda-bypassed"
REPLACED_BY_COMPAT = frozenset({"vcuda", "vcuda-fork", "lupine", "unrecognized", BYPASSED_VCUDA})


@value_type
class CompatPlan:
    env: dict[str, str]  # what the guard sets (auto mode)
    problems: tuple[Problem, ...]


def switch_on(environ: Mapping[str, str]) -> bool:
    """As env_override reads it: "1" or "true", any case, spaces trimmed."""
    return environ.get(SWITCH, "0").strip().lower() in ("1", "true")


def _directory(environ: Mapping[str, str]) -> str:
    named = environ.get(DIRECTORY, "").strip()
    default = "$CONDA_PREFIX/cuda-compat or /usr/local/cuda-<torch's CUDA>/compat"
    return named or f"the CUDA compat directory ({default})"


def plan_compat(environ: Mapping[str, str], layers: tuple[tuple[str, str], ...], apply: bool) -> CompatPlan:
    """`layers`: (name, label) of the layers found. Where the switch is on and a layer replaces
    libcuda.so.1, auto mode turns it off (the layer stays in force) and says so; validate mode says what
    auto would do. The problem stands either way: strict mode stops on it."""
    replaced = next((label for name, label in layers if name in REPLACED_BY_COMPAT), None)
    if replaced is None or not switch_on(environ):
        return CompatPlan({}, ())
    done = (
        f"the guard set {SWITCH}=0 before vLLM read it: the layer stays in force"
        if apply
        else f"vLLM's EngineCore and workers would load NVIDIA's libcuda.so.1, outside {replaced}'s quota"
    )
    problem = Problem(
        COMPAT_BYPASSES_LAYER,
        cause=f"{SWITCH}={environ[SWITCH].strip()} makes vLLM put {_directory(environ)} first on "
        f"LD_LIBRARY_PATH for its children, whose libcuda.so.1 would then be NVIDIA's and not {replaced}'s",
        consequence=done,
        fix=f"unset {SWITCH}: {replaced} stands in for the driver library, and forward compatibility needs "
        "NVIDIA's own (a newer driver on the node is the way to a newer CUDA)",
        subject=SWITCH,
    )
    return CompatPlan({SWITCH: "0"} if apply else {}, (problem,))


def bypass_problem(label: str, quota_source: str, libcuda: str | None, environ: Mapping[str, str]) -> Problem:
    """A layer whose quota is configured in the pod (`quota_source`) but whose library does not answer
    libcuda.so.1 in this process (`libcuda`: the file that does)."""
    path = environ.get("LD_LIBRARY_PATH", "").split(":")[0]
    first = f" ({path} is first on LD_LIBRARY_PATH)" if path else ""
    return Problem(
        LAYER_BYPASSED,
        cause=f"{label}'s quota is configured ({quota_source}) but this process's libcuda.so.1 is "
        f"{libcuda or 'none'}, not the layer's{first}",
        consequence="this process's allocations and launches bypass the layer: no memory quota, and it can "
        "take the whole GPU from the pods sharing it",
        fix=f"take the directory that puts NVIDIA's libcuda.so.1 ahead of the layer's off LD_LIBRARY_PATH, "
        f"and unset {SWITCH} (vLLM's compat switch does exactly that for its children)",
        subject=libcuda,
    )
