"""The TMAGUARD_* environment toggles: their specification and a pure parser."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
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
        "auto: Hopper TMA kernels on sm_90 when a real encoder is reachable, else Marlin/cp.async paths; "
        "hopper: insist on the TMA kernels (start-up stops if TMA is unusable); portable: Marlin/cp.async "
        "everywhere; latency: Marlin for W4A16/W8A16 on sm_90 (faster serving one request at a time, slower "
        "serving many)",
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
        "format of the one record line per process on the vllm_tmaguard logger",
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
)

_SPECS = {spec.name: spec for spec in TOGGLES}


class ToggleError(ValueError):
    """A TMAGUARD_* variable has a value outside what it allows."""

    def __init__(self, name: str, value: str, allowed: str) -> None:
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name}={value!r} is not valid; allowed: {allowed}")


@dataclass(frozen=True)
class Toggles:
    mode: str = "auto"
    strict: bool = False
    gemm: str = "auto"
    overlay: str = "auto"
    log_format: str = "text"
    root: str = "/"
    record_dir: str = ""


def default_record_dir() -> str:
    return f"/tmp/tmaguard-{os.getuid()}"


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
    if must_exist and not os.path.isdir(raw):
        raise ToggleError(name, raw, "an existing directory")
    return raw


def parse_toggles(environ: Mapping[str, str]) -> Toggles:
    """Reads every toggle; raises ToggleError naming the first bad variable, its value and what is allowed."""
    return Toggles(
        mode=_choice(environ, "TMAGUARD_MODE"),
        strict=_choice(environ, "TMAGUARD_STRICT") == "1",
        gemm=_choice(environ, "TMAGUARD_GEMM"),
        overlay=_choice(environ, "TMAGUARD_OVERLAY"),
        log_format=_choice(environ, "TMAGUARD_LOG_FORMAT"),
        root=_directory(environ, "TMAGUARD_ROOT", "/", must_exist=True),
        record_dir=_directory(environ, "TMAGUARD_RECORD_DIR", default_record_dir(), must_exist=False),
    )


def strict_requested(environ: Mapping[str, str]) -> bool:
    """Strict mode as far as it can be read when the toggles as a whole are invalid."""
    return environ.get("TMAGUARD_STRICT", "").strip() == "1"
