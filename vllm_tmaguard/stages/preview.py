"""What the guard would find and do in a vLLM server started here, as its record, with nothing changed: the
full run's own decision script (pipeline.decide) with its actions not taken (for `tmaguard check` and
`tmaguard doctor`), so that the two can never disagree."""

from __future__ import annotations

from collections.abc import Mapping

from .inputs import watched_environ
from .outcomes import Problem
from .pipeline import SERVER_DEFAULTS, Decision, decide
from .record import Record
from .store import RecordDir
from .toggles import Toggles

Preview = Decision


def preview_all(
    environ: Mapping[str, str],
    toggles: Toggles,
    trigger: str,
    vllm_dir: str | None = None,
    toggle_problems: tuple[Problem, ...] = (),
) -> Preview:
    """The decision for a vLLM server started here with vLLM's own settings (neither the check nor the
    doctor sees the command line vLLM will be given); no private directory is touched."""
    records = RecordDir(None, toggles.record_dir)
    return decide(
        trigger, watched_environ(environ), toggles, toggle_problems, SERVER_DEFAULTS, records, apply=False,
        vllm_dir=vllm_dir,
    )  # fmt: skip


def preview(
    environ: Mapping[str, str], toggles: Toggles, trigger: str, vllm_dir: str | None = None
) -> Record:
    return preview_all(environ, toggles, trigger, vllm_dir).record
