"""The one log line per process, in vLLM's style: the vllm_tmaguard logger with vLLM's format, and the
fitting of a line's parts into its limit. Both the full run (record.py renders the parts from the record's
fields) and a replayed verdict (verdict.py) log through here; standard library only, as both must be cheap to
import."""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("vllm_tmaguard")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
# vLLM's own format (vllm/logger.py), so the line sits naturally among vLLM's.
_FORMAT = "(tmaguard pid=%(process)d) %(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"
# vLLM's prefix (pid, level, time, file) keeps the whole line within 400 characters, readable in `kubectl
# logs`. The detail is in the record file and `tmaguard doctor`.
MESSAGE_LIMIT = 335


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def fit_line(essential: list[str], optional: list[str], limit: int = MESSAGE_LIMIT) -> str:
    """The parts joined with "; ": every essential part (the caller sized them to fit), then the optional
    ones in order while they fit, the first that does not fit clipped into what room is left."""
    room = limit - sum(len(part) + 2 for part in essential)
    kept = []
    for part in optional:
        if len(part) + 2 <= room:
            kept.append(part)
            room -= len(part) + 2
        elif room > 30:
            kept.append(clip(part, room - 2))
            room = 0
    return clip("; ".join(essential + kept), limit)


def details(record_file: str | None) -> str:
    """The line's last part: where the whole record is."""
    return f"details: {record_file or 'tmaguard doctor'}"


def ensure_handler() -> None:
    """Our own stream handler in vLLM's format, unless the user runs their own logging configuration."""
    if logger.handlers or os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(_FORMAT, _DATE_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(
        logging.DEBUG if os.environ.get("VLLM_LOGGING_LEVEL", "").upper() == "DEBUG" else logging.INFO
    )
    logger.propagate = False


def log(level: str, message: str) -> None:
    """Logs one line at `level` (a key of LEVELS). The caller has redacted it."""
    ensure_handler()
    logger.log(LEVELS[level], message, stacklevel=2)
