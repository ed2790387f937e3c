"""vLLM's plugin entry points. Both run the same once-per-process guard."""

from __future__ import annotations

import contextlib


def platform_plugin() -> None:
    """vllm.platform_plugins: called in every process while vLLM resolves its platform, before
    vllm.platforms.cuda imports the extension. Returns None: this plugin never claims the platform."""
    from .guard import activate

    activate("platform-plugin")
    return None


def general_plugin() -> None:
    """vllm.general_plugins: later, in every process; a no-op when the guard already ran. In the API server,
    where vLLM serves prometheus_client's registry by then, it also puts the record on /metrics."""
    from .guard import activate
    from .metrics import export

    record = activate("general-plugin")
    with contextlib.suppress(Exception):  # fail open: a metric is never worth a failed start-up
        export(record)
