"""Stopping start-up: in strict mode (TMAGUARD_STRICT=1) on any problem of the issued record or on the
guard's own failure, and in any mode where the routing TMAGUARD_GEMM insists on cannot be had. The stop
names what asked for it, its cause and its fix, on stderr and in the container's termination message.
Standard library only: the activation's fail-open envelope (guard.py) may need it before anything else is
imported."""

from __future__ import annotations

import contextlib
from typing import Any

from .codes import ROUTING_IMPOSSIBLE
from .files import append_line

TERMINATION_LOG = "/dev/termination-log"  # Kubernetes' default terminationMessagePath; never under a root
STRICT = "TMAGUARD_STRICT=1"


class GuardStop(SystemExit):
    """Stops start-up. A SystemExit, because vLLM's plugin loader swallows Exceptions. `by`: the setting
    that asked for the stop (TMAGUARD_STRICT=1, TMAGUARD_GEMM=hopper)."""

    def __init__(self, cause: str, fix: str, by: str = STRICT) -> None:
        self.cause, self.fix, self.by = cause, fix, by
        super().__init__(f"vllm-tmaguard ({by}) stopped start-up: {cause}. Fix: {fix}")


def stop_for(problems: list[dict[str, Any]], strict: bool, gemm: str) -> GuardStop | None:
    """Strict mode stops on any problem of the record as issued (a refused write included), naming each; an
    impossible routing demand stops start-up in any mode, naming the demand."""
    impossible = [p for p in problems if p["code"] == ROUTING_IMPOSSIBLE]
    stopping = impossible or (problems if strict else [])
    if not stopping:
        return None
    by = f"TMAGUARD_GEMM={gemm}" if impossible else STRICT
    return GuardStop("; ".join(p["cause"] for p in stopping), stopping[0]["fix"], by)


def internal_stop(error: BaseException) -> GuardStop:
    return GuardStop(f"internal error {type(error).__name__}: {error}", "report it, or set TMAGUARD_MODE=off")


def tell_kubernetes(stop: GuardStop) -> GuardStop:
    """The stop's line where `kubectl describe pod` shows it: appended to the container's termination
    message file where the kubelet made one (never created, never through a link: outside Kubernetes there
    is none)."""
    with contextlib.suppress(OSError):
        append_line(TERMINATION_LOG, str(stop.code))
    return stop
