"""The TMAGUARD_* environment toggles: their specification and pure parsers. In a vLLM process a bad value
falls back to that toggle's default with a problem naming the variable, the value and what is allowed
(read_toggles): a typo in a routing or logging setting never drops the symbol fix. The CLI refuses it
outright (parse_toggles)."""

import os
from collections.abc import Mapping

from ..codes import TOGGLE_INVALID, TOGGLE_UNKNOWN
from ..files import default_record_dir
from .door import is_directory
from .outcomes import Problem
from .values import value_type


@value_type
class ToggleSpec:
    name: str
    allowed: tuple[str, ...]  # empty: free-form (described by `kind`)
    default: str
    effect: str
    kind: str = "choice"


TOGGLES: tuple[ToggleSpec, ...] = (
    ToggleSpec(
        "TMAGUARD_MODE",
        ("auto", "validate", "off"),
        "auto",
        "auto: supply missing driver entry points and steer vLLM's kernels; "
        "validate: report what auto would do, change nothing; off: do nothing",
    ),
    ToggleSpec(
        "TMAGUARD_STRICT",
        ("0", "1"),
        "0",
        "1: stop start-up with the cause and the fix when the guard finds a problem it cannot fix "
        "(or fails itself); 0: log it and let vLLM go on",
    ),
    ToggleSpec(
        "TMAGUARD_GEMM",
        ("auto", "hopper", "portable", "latency"),
        "auto",
        "auto: Hopper TMA kernels on sm_90 when a real encoder is reachable, else Marlin/cp.async paths "
        "(and Marlin for W4A16 under a network layer when vLLM runs eager); "
        "hopper: insist on the TMA kernels (start-up stops if TMA is unusable); portable: Marlin/cp.async "
        "everywhere; latency: Marlin for W4A16/W8A16 on sm_90 (faster serving one request at a time, slower "
        "serving many)",
    ),
    ToggleSpec(
        "TMAGUARD_MEMORY",
        ("fit", "warn", "off"),
        "fit",
        "fit: under a layer's memory limit, where vLLM's default --gpu-memory-utilization cannot start, "
        "add the largest that can to the server's command line (a user's own value is never changed, only "
        "warned about); warn: say so, change nothing; off: neither",
    ),
    ToggleSpec(
        "TMAGUARD_OVERLAY",
        ("auto", "off"),
        "auto",
        "auto: when the layer lacks entry points that CUDA runtime 12+ or Triton look up in libcuda.so.1's "
        "own handle, load the overlay libcuda.so.1 (layer + what it lacks); off: RTLD_GLOBAL shims only",
    ),
    ToggleSpec(
        "TMAGUARD_LOG_FORMAT",
        ("text", "json"),
        "text",
        "the one record line's format (stdout, or the vllm_tmaguard logger under a user's own logging)",
    ),
    ToggleSpec(
        "TMAGUARD_TRACE",
        ("0", "1"),
        "0",
        "1: the overlay and the shims print one line on stderr per driver look-up and resolution, with where "
        "it was answered (for a failed pod's diagnosis); read by the libraries themselves",
    ),
    ToggleSpec(
        "TMAGUARD_ROOT",
        (),
        "/",
        "root prefix for the guard's file-system probes (ld.so.cache, layer fingerprints); for tests "
        "and for inspecting a pod's files from outside",
        kind="directory",
    ),
    ToggleSpec(
        "TMAGUARD_RECORD_DIR",
        (),
        "/tmp/tmaguard-<uid>",
        "directory for last.json (read by `tmaguard doctor`), the scan cache and the overlay's file; must be "
        "this user's and private (0700), else refused: the overlay then stays in memory",
        kind="directory (created 0700)",
    ),
    ToggleSpec(
        "TMAGUARD_WHEEL_SHA256",
        (),
        "unset",
        "on the zero-image init container (`tmaguard inject --wheel`), not the vLLM container: place the "
        "package only from a wheel whose sha256 is listed, so that an edited wheel ConfigMap is refused; "
        "`tmaguard manifests --wheel` sets it, `tmaguard wheel-configmap` prints it; unset: any wheel its "
        "RECORD vouches for",
        kind="sha256 digests, comma-separated",
    ),
)

_SPECS = {spec.name: spec for spec in TOGGLES}


class ToggleError(ValueError):
    """A TMAGUARD_* variable has a value outside what it allows."""

    def __init__(self, name: str, value: str, allowed: str) -> None:
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name}={value!r} is not valid; allowed: {allowed}")


@value_type
class Toggles:
    mode: str = "auto"
    strict: bool = False
    gemm: str = "auto"
    overlay: str = "auto"
    memory: str = "fit"
    log_format: str = "text"
    trace: bool = False
    root: str = "/"
    record_dir: str = ""
    wheel_pins: tuple[str, ...] = ()


def _choice(environ: Mapping[str, str], name: str) -> str:
    spec = _SPECS[name]
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return spec.default
    value = raw.strip().lower()
    if value not in spec.allowed:
        raise ToggleError(name, raw, " | ".join(spec.allowed))
    return value


def _directory(environ: Mapping[str, str], name: str, default: str, must_exist: bool) -> str:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if not os.path.isabs(raw):
        raise ToggleError(name, raw, "an absolute directory path")
    if must_exist and not is_directory(raw):
        raise ToggleError(name, raw, "an existing directory")
    return raw


_HEX = frozenset("0123456789abcdef")


def _digests(environ: Mapping[str, str], name: str) -> tuple[str, ...]:
    raw = environ.get(name, "")
    digests = tuple(raw.replace(",", " ").lower().split())
    if any(len(digest) != 64 or not set(digest) <= _HEX for digest in digests):
        raise ToggleError(name, raw, "sha256 digests (64 hex digits each), comma-separated")
    return digests


# Values people write, and the setting they meant.
NEAR_MISSES = {
    ("TMAGUARD_MODE", "strict"): "TMAGUARD_STRICT=1 (strict mode is a toggle of its own)",
    ("TMAGUARD_MODE", "on"): "TMAGUARD_MODE=auto",
    ("TMAGUARD_MODE", "true"): "TMAGUARD_MODE=auto",
    ("TMAGUARD_MODE", "false"): "TMAGUARD_MODE=off",
    ("TMAGUARD_MODE", "check"): "TMAGUARD_MODE=validate",
    ("TMAGUARD_STRICT", "true"): "TMAGUARD_STRICT=1",
    ("TMAGUARD_STRICT", "yes"): "TMAGUARD_STRICT=1",
    ("TMAGUARD_STRICT", "on"): "TMAGUARD_STRICT=1",
    ("TMAGUARD_STRICT", "false"): "TMAGUARD_STRICT=0",
    ("TMAGUARD_GEMM", "marlin"): "TMAGUARD_GEMM=portable (or =latency: Marlin on sm_90 for W4A16/W8A16)",
    ("TMAGUARD_GEMM", "machete"): "TMAGUARD_GEMM=hopper",
    ("TMAGUARD_GEMM", "tma"): "TMAGUARD_GEMM=hopper",
    ("TMAGUARD_OVERLAY", "on"): "TMAGUARD_OVERLAY=auto",
    ("TMAGUARD_OVERLAY", "0"): "TMAGUARD_OVERLAY=off",
    ("TMAGUARD_OVERLAY", "false"): "TMAGUARD_OVERLAY=off",
    ("TMAGUARD_MEMORY", "auto"): "TMAGUARD_MEMORY=fit",
    ("TMAGUARD_MEMORY", "0"): "TMAGUARD_MEMORY=off",
}
_FIELD_OF = {
    "TMAGUARD_MODE": "mode",
    "TMAGUARD_STRICT": "strict",
    "TMAGUARD_GEMM": "gemm",
    "TMAGUARD_OVERLAY": "overlay",
    "TMAGUARD_MEMORY": "memory",
    "TMAGUARD_LOG_FORMAT": "log_format",
    "TMAGUARD_TRACE": "trace",
    "TMAGUARD_ROOT": "root",
    "TMAGUARD_RECORD_DIR": "record_dir",
    "TMAGUARD_WHEEL_SHA256": "wheel_pins",
}


def parse_toggles(environ: Mapping[str, str]) -> Toggles:
    """Reads every toggle; raises ToggleError naming the first bad variable, its value and what is allowed."""
    return Toggles(
        mode=_choice(environ, "TMAGUARD_MODE"),
        strict=_choice(environ, "TMAGUARD_STRICT") == "1",
        gemm=_choice(environ, "TMAGUARD_GEMM"),
        overlay=_choice(environ, "TMAGUARD_OVERLAY"),
        memory=_choice(environ, "TMAGUARD_MEMORY"),
        log_format=_choice(environ, "TMAGUARD_LOG_FORMAT"),
        trace=_choice(environ, "TMAGUARD_TRACE") == "1",
        root=_directory(environ, "TMAGUARD_ROOT", "/", must_exist=True),
        record_dir=_directory(environ, "TMAGUARD_RECORD_DIR", default_record_dir(), must_exist=False),
        wheel_pins=_digests(environ, "TMAGUARD_WHEEL_SHA256"),
    )


def read_toggles(environ: Mapping[str, str]) -> tuple[Toggles, tuple[Problem, ...]]:
    """Every toggle, each bad one at its default, with a problem per bad value and per TMAGUARD_* variable
    that is no toggle (a misspelt name). Never raises."""
    values: dict[str, object] = {}
    problems = []
    for name, field_name in _FIELD_OF.items():
        if name not in environ:
            continue
        try:
            values[field_name] = getattr(parse_toggles({name: environ[name]}), field_name)
        except ToggleError as error:
            problems.append(_invalid(error))
    toggles = Toggles(**{**_defaults(), **values})
    problems += [
        _unknown(name) for name in sorted(environ) if name.startswith("TMAGUARD_") and name not in _SPECS
    ]
    return toggles, tuple(problems)


def _defaults() -> dict[str, object]:
    defaults: dict[str, object] = dict(Toggles._field_defaults)
    defaults["record_dir"] = default_record_dir()
    return defaults


def _invalid(error: ToggleError) -> Problem:
    spec = _SPECS[error.name]
    hint = NEAR_MISSES.get((error.name, error.value.strip().lower()))
    fix = f"set {error.name} to {error.allowed}" + (f"; did you mean {hint}?" if hint else "")
    return Problem(
        TOGGLE_INVALID,
        cause=f"{error.name}={error.value!r} is not valid",
        consequence=f"{error.name} falls back to its default, {spec.default}",
        fix=fix,
        subject=error.name,
    )


def _unknown(name: str) -> Problem:
    import difflib  # only for a misspelt name: not on every start-up's path

    close = difflib.get_close_matches(name, list(_SPECS), n=1)
    return Problem(
        TOGGLE_UNKNOWN,
        cause=f"{name} is not a tmaguard toggle",
        consequence="it has no effect",
        fix=f"did you mean {close[0]}?" if close else f"use one of {', '.join(_SPECS)}",
        subject=name,
    )


def strict_requested(environ: Mapping[str, str]) -> bool:
    """Strict mode as far as it can be read when the toggles as a whole are invalid."""
    return environ.get("TMAGUARD_STRICT", "").strip() == "1"
