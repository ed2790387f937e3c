"""Issuing a verdict (docs/design.md §4): its record written to the private directory (process-<pid>.json,
and last.json, what `tmaguard doctor` reads first) and its one log line, rendered from the record document's
fields (already redacted) in vLLM's style: its level, its parts, fitted to its limit, written to stdout in
vLLM's format (or through the vllm_tmaguard logger where the user runs their own logging). One function for
every process: the full run's, a replay's, a forked child's. A record the directory refuses is a problem of
that record (RECORD_NOT_WRITTEN), logged with it. Standard library only: every vLLM process issues its
verdict (the line and the writing in one module, one import fewer)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from types import FrameType
from typing import Any

from .codes import (
    LOAD_OVERLAY,
    LOAD_SHIM,
    LOGGED_AS_ERROR,
    NO_GPU,
    RECORD_DIR_REFUSED,
    RECORD_NOT_WRITTEN,
    SET_ARG,
)
from .files import private

logger = logging.getLogger("vllm_tmaguard")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
# vLLM's own format (vllm/logger.py), so the line sits naturally among vLLM's (_write_line writes it).
_LINE_FORMAT = "(tmaguard pid=%(process)d) %(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"
# vLLM's prefix (pid, level, time, file) keeps the whole line within 400 characters, readable in `kubectl
# logs`. The detail is in the record file and `tmaguard doctor`.
MESSAGE_LIMIT = 335


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def printable(text: str) -> str:
    """`text` as any stream can print it: bytes a path held that are not UTF-8 (surrogate escapes) and
    control characters as backslash escapes."""
    escaped = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if escaped.isprintable():
        return escaped
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in escaped)


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


# The layers' caveats worth the line (metering.py: severity "warning"), in a phrase each.
_CAVEATS = {
    "sm-limiter-overflow": "its SM limiter overflows on large GPUs and slows serving to a quarter",
    "hami-cuda-12.8-hang": "this build hangs under CUDA 12.8+ runtimes",
    "hidden-build-meters-nothing": "a hidden-visibility build that meters nothing",
    "cuda-graph-capture-fails": "CUDA-graph capture fails",
    "half-cublas-fails": "fp16/bf16 cuBLAS GEMMs fail (a quantized model cannot serve here)",
    "meters-nothing-cuda12": "meters nothing under CUDA 12+ runtimes",
}


def caveat_parts(document: dict[str, Any]) -> list[str]:
    """One part per warning-level caveat of a layer: what fails, and the vLLM flags that avoid it."""
    parts = []
    for layer in document.get("metering") or []:
        for caveat in layer["caveats"]:
            if caveat["severity"] != "warning":
                continue
            part = f"{layer['layer']}: {_CAVEATS.get(caveat['code'], caveat['code'])}"
            if caveat["vllm_args"]:
                import shlex  # only here: a caveat with flags is rare, and every process imports this module

                part += f"; pass {shlex.join(caveat['vllm_args'])}"
                part += f" (or {shlex.join(caveat['or_vllm_args'])})" if caveat["or_vllm_args"] else ""
            else:
                part += "; see tmaguard doctor"
            parts.append(part)
    return parts


def level_of(document: dict[str, Any]) -> str:
    """error: vLLM cannot start here (codes.LOGGED_AS_ERROR); warning: a problem (a bad toggle too, even on
    a machine without a GPU), a path no knob reaches or a layer's warning-level caveat; debug: nothing to do
    here; else info."""
    routing = document.get("routing") or {}
    if any(problem["code"] in LOGGED_AS_ERROR for problem in document["problems"]):
        return "error"
    if document["problems"] or routing.get("hints") or caveat_parts(document):
        return "warning"
    return "debug" if document["outcome"] == NO_GPU else "info"


def line_parts(document: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The essential parts (the outcome, what was loaded, the first problem's cause, given whatever room the
    rest leaves it, and its fix, then the layers' warning-level caveats with the vLLM flags each needs) and
    the optional ones in the order they are dropped last (the routing in a phrase).
    Where the record went is essential when the record directory was refused (the operator looks for it
    elsewhere), else the last optional part (render)."""
    head = f"tmaguard: {clip(document['summary'], 100)}"
    loaded = _loaded(document["actions"])
    essential = [head, *([loaded] if loaded else [])]
    caveats = caveat_parts(document)
    problems = document["problems"]
    if problems:
        first = problems[0]
        count = f" ({len(problems)})" if len(problems) > 1 else ""
        fix = f"fix: {clip(first['fix'], 110)}"
        label = f"PROBLEM{count}: "
        moved = _moved_to(document)
        taken = sum(len(p) + 2 for p in essential + caveats)
        room = MESSAGE_LIMIT - taken - len(label) - len(fix) - len(moved) - 4
        essential += [label + clip(first["cause"], max(room, 40)), fix, *([moved] if moved else [])]
    essential += caveats
    optional = [part for part in (_routing_phrase(document.get("routing"), document.get("tma")),) if part]
    return essential, optional


def _moved_to(document: dict[str, Any]) -> str:
    """Where the record went, when it is not where the operator asked for it."""
    if not any(p["code"] == RECORD_DIR_REFUSED for p in document["problems"]):
        return ""
    return f"record: {document.get('record_file') or 'none written'}"


def render(document: dict[str, Any]) -> str:
    """The whole line, as logged: the outcome and the first problem always stay; the routing and the
    record's place go first."""
    essential, optional = line_parts(document)
    if _moved_to(document):
        return fit_line(essential, optional)
    return fit_line(essential, [*optional, details(document.get("record_file"))])


def _loaded(actions: list[dict[str, Any]]) -> str | None:
    overlay = [a for a in actions if a["kind"] == LOAD_OVERLAY]
    shims = [a for a in actions if a["kind"] == LOAD_SHIM]
    parts = []
    if overlay:
        where = " (in memory)" if overlay[0].get("in_memory") else ""
        parts.append(f"overlay {'loaded' if overlay[0]['applied'] else 'would be loaded'}{where}")
    if shims:
        names = ", ".join(a["target"] for a in shims)
        parts.append(f"shims {'loaded' if shims[0]['applied'] else 'would be loaded'} ({names})")
    for flag in (a for a in actions if a["kind"] == SET_ARG):  # memory.py: the layer's limit, what fits it
        parts.append(f"{flag['target']} {flag['value']} {'set' if flag['applied'] else 'would be set'}")
    return "; ".join(parts) or None


def _routing_phrase(routing: dict[str, Any] | None, tma: dict[str, Any] | None) -> str | None:
    if routing is None:
        return None
    changes = []
    if routing["disabled_kernels"]:
        changes.append(f"{len(routing['disabled_kernels'])} kernels off")
    if any(name.endswith("USE_DEEP_GEMM") for name in routing["env"]):
        changes.append("DeepGEMM off")
    if routing["blocked_imports"]:
        changes.append(f"{len(routing['blocked_imports'])} extensions blocked")
    if not changes:
        changes.append("vLLM's own choices" + (", TMA kept" if tma and tma["usable"] else ""))
    counted = {"hint": routing["hints"], "note": routing["stale"]}
    notes = [f"{len(items)} {what}{'s' * (len(items) > 1)}" for what, items in counted.items() if items]
    return "routing: " + ", ".join(changes + notes)


def _own_line() -> bool:
    """Whether the line is ours to write, in vLLM's format on stdout: unless the user runs their own logging
    configuration (VLLM_CONFIGURE_LOGGING=0, or handlers on the vllm_tmaguard logger), which then gets it."""
    return not logger.handlers and os.environ.get("VLLM_CONFIGURE_LOGGING", "1") != "0"


def _write_line(level: str, text: str, caller: FrameType) -> None:
    """The line as logging's StreamHandler would write it in _LINE_FORMAT (this process's pid, the level,
    the time, the caller's file and line), written directly: a handler, a formatter and a LogRecord cost
    ~0.1 ms of every vLLM process's start. Below INFO only with VLLM_LOGGING_LEVEL=DEBUG, as vLLM's."""
    if level == "debug" and os.environ.get("VLLM_LOGGING_LEVEL", "").upper() != "DEBUG":
        return
    where = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
    when = time.strftime(_DATE_FORMAT)
    try:
        sys.stdout.write(f"(tmaguard pid={os.getpid()}) {level.upper()} {when} [{where}] {text}\n")
        sys.stdout.flush()
    except (AttributeError, OSError, ValueError):  # no stdout, or a closed one: the record file remains
        pass


def log(level: str, message: str) -> None:
    """Logs one line at `level` (a key of LEVELS), printable on any stream. The caller has redacted it."""
    text = printable(message)
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        text = text.encode(encoding, "backslashreplace").decode(encoding, "replace")
    if _own_line():
        _write_line(level, text, sys._getframe(1))
    else:
        logger.log(LEVELS[level], text, stacklevel=2)


def announce(document: dict[str, Any], log_format: str) -> None:
    """Logs the record's one line (TMAGUARD_LOG_FORMAT=json: the whole record)."""
    text = json.dumps(document) if log_format == "json" else render(document)
    log(level_of(document), text)


# ---------------------------------------------------------------------------------------------------------
# The record


class Issued:
    """A process's verdict as issued: its record document, where it was written (None: nowhere), and the log
    format it was logged in (a forked child issues its own record the same way). A plain class: a NamedTuple
    costs ~0.2 ms to define (Python 3.12), in every vLLM process."""

    __slots__ = ("directory", "document", "log_format")

    def __init__(self, document: dict[str, Any], directory: str | None, log_format: str) -> None:
        self.document, self.directory, self.log_format = document, directory, log_format


PROCESS_RECORDS_KEPT = 64  # per-process records kept in the record directory, newest first
# Pruned back to the newest 64 once 64 + 16 are there: ranking them by age stats each (~0.2 ms), which every
# later process of a long-lived pod paid when it was done at 65.
PROCESS_RECORDS_SLACK = 16
LAST_RECORD = "last.json"


def process_record_name(pid: int) -> str:
    return f"process-{pid}.json"


def write_record(document: dict[str, Any], directory: str) -> str:
    """Writes the process's own record and makes last.json the same file; its path. Raises OSError where the
    directory refuses (neither file is then left half-written)."""
    name = process_record_name(document["pid"])
    path = os.path.join(directory, name)
    with private(directory) as opened:
        opened.write(name, json.dumps({**document, "record_file": path}).encode())
        opened.link(name, LAST_RECORD)
        opened.prune("process-", ".json", PROCESS_RECORDS_KEPT, PROCESS_RECORDS_SLACK)
    return path


def not_written(directory: str, error: OSError) -> dict[str, Any]:
    """The problem of a record the directory refused, as the record holds it (outcomes.Problem's fields)."""
    return {
        "code": RECORD_NOT_WRITTEN,
        "cause": f"could not write the record to {directory}: {error.strerror or error}",
        "consequence": "`tmaguard doctor` cannot read this process's record; the log line is all there is",
        "fix": "free space in, or give this user write access to, TMAGUARD_RECORD_DIR",
        "symbol": None,
        "subject": directory,
    }


def issue(document: dict[str, Any], directory: str | None, log_format: str) -> Issued:
    """The record written (where there is a directory) and logged; as issued: its record_file set, or
    RECORD_NOT_WRITTEN among its problems (and no directory)."""
    if directory is not None:
        try:
            document = {**document, "record_file": write_record(document, directory)}
        except OSError as error:
            problems = [*document["problems"], not_written(directory, error)]
            document, directory = {**document, "record_file": None, "problems": problems}, None
    announce(document, log_format)
    return Issued(document, directory, log_format)
