"""The environment a verdict is decided from, for the verdict cache (verdict.py, docs/design.md §4.1):
LD_LIBRARY_PATH and LD_PRELOAD (the loader's search, HAMi's preload), the toggles (TMAGUARD_*), the sharing
layers' variables (layers.ENV_PREFIXES) and the knobs routing merges with (routing.ENV_NAMES). The stages get
these and nothing else (watched_environ), so a test can tell when a stage reads one more. The files are what
the stages read through the door (door.noting), not listed here. Besides: vLLM's compat switch and what
picks its directory (compat.py), MPS's pinned memory limit (memory.py)."""

from __future__ import annotations

from collections.abc import Mapping

from .compat import ENV_NAMES as COMPAT_ENV_NAMES
from .layers import ENV_PREFIXES as LAYER_ENV_PREFIXES
from .memory import ENV_NAMES as MEMORY_ENV_NAMES
from .routing import ENV_NAMES as ROUTING_ENV_NAMES

ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", *ROUTING_ENV_NAMES, *COMPAT_ENV_NAMES, *MEMORY_ENV_NAMES)
ENV_PREFIXES = ("TMAGUARD_", *LAYER_ENV_PREFIXES)


def watched_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the environment the stages read."""
    return {name: environ[name] for name in environ if name in ENV_NAMES or name.startswith(ENV_PREFIXES)}
