"""vLLM's plugin entry points. Both run the same once-per-process guard."""

from __future__ import annotations


def platform_plugin() -> None:
    """vllm.platform_plugins: called in every process while vLLM resolves its platform, before
    vllm.platforms.cuda imports the extension. Returns None: this plugin never claims the platform."""
    from .guard import activate

    activate("platform-plugin")
    return None


def general_plugin() -> None:
    """vllm.general_plugins: later, in every process; a no-op when the guard already ran."""
    from .guard import activate

    activate("general-plugin")
