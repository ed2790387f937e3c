"""The one record per process: built from facts, decision and outcome; logged on the vllm_tmaguard logger
in vLLM's style (or JSON) and written where `tmaguard doctor` reads it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from typing import Any

from . import __version__
from .actions import Outcome
from .decision import HANDLE_SCOPED, Decision
from .facts import Facts
from .libraries import SHIM_FILES
from .routing import Routing
from .toggles import default_record_dir
from .trust import redact

logger = logging.getLogger("vllm_tmaguard")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
# vLLM's own format (vllm/logger.py), so the line sits naturally among vLLM's.
_FORMAT = "(tmaguard pid=%(process)d) %(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"


def build_record(
    facts: Facts, decision: Decision, outcome: Outcome, mode: str, elapsed_ms: float
) -> dict[str, Any]:
    """The record, secrets redacted (trust.py): it is logged and written to disk."""
    driver = facts.driver
    missing = {s: list(m) for s, m in facts.vllm.needs().items() if driver.info and not driver.exports(s)}
    record = {
        "tmaguard": __version__,
        "pid": os.getpid(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "trigger": facts.trigger,
        "mode": mode,
        "summary": decision.summary,
        "gpu": {
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "compute_capability": "{}.{}".format(*g.compute_capability),
                    "mig": g.mig,
                    "virtualization": g.virtualization,
                }
                for g in facts.gpu.gpus
            ],
            "driver_version": facts.gpu.driver_version,
            "cuda_driver_version": facts.gpu.cuda_driver_version,
            "error": facts.gpu.error,
        },
        "layer": [{"name": layer.name, "evidence": list(layer.evidence)} for layer in facts.layers],
        "libcuda": {
            "path": driver.path,
            "how": driver.resolution.how,
            "soname": driver.info.soname if driver.info else None,
            "mapped": list(driver.resolution.mapped),
            "real_driver": driver.real_driver,
            "overlay_of": driver.overlay_of,
            "error": driver.error,
        },
        "vllm": {
            "version": facts.vllm.version,
            "found": facts.vllm.found,
            "platform_plugins": facts.vllm.platform_plugins,
        },
        "missing": missing,
        "supplied": {
            s: supply.library
            for supply in decision.supplies
            for s in supply.symbols
            if s in missing or s in HANDLE_SCOPED
        },
        "tma": None
        if decision.tma is None
        else {"usable": decision.tma.usable, "reason": decision.tma.reason},
        "routing": _routing_record(decision.routing),
        "unfixed": list(decision.unfixed),
        "actions": list(outcome.done) if decision.apply else _would(decision),
        "failed": list(outcome.failed),
        "elapsed_ms": round(elapsed_ms, 2),
    }
    return redact(record)


def _routing_record(routing: Routing | None) -> dict[str, Any] | None:
    if routing is None:
        return None
    return {
        "families": [{"family": f.family, "path": f.path, "why": f.why} for f in routing.families],
        "env": routing.env,
        "blocked_imports": list(routing.block_modules),
        "disabled_kernels": [{"kernel": name, "why": why} for name, why in routing.disabled],
        "overrides": list(routing.overrides),
        "hints": list(routing.hints),
        "stale": list(routing.stale),
        "error": routing.error,
    }


def _would(decision: Decision) -> list[str]:
    would = [f"would load the {_library_name(s.library)}" for s in decision.supplies]
    if decision.routing:
        would += [f"would set {k}={v}" for k, v in decision.routing.env.items()]
        would += [f"would keep {m} from importing" for m in decision.routing.block_modules]
    return would


def _library_name(library: str) -> str:
    return library if library == "overlay" else f"{library} shim"


# The one log line's message; vLLM's prefix (pid, level, time, file) keeps the whole line within 400
# characters, readable in `kubectl logs`. The detail is in the record file and `tmaguard doctor`.
MESSAGE_LIMIT = 335
_PART_LIMIT = 150
_SHIM_NAMES = {file: name for name, file in SHIM_FILES.items()}
_NOT_WRITTEN = ("TMAGUARD_RECORD_DIR unusable", "could not write the record")  # guard.py's failures


def render_text(record: dict[str, Any]) -> str:
    """The log line: the outcome, what was loaded, the first failure and problem, the routing in a phrase,
    and where the full record is. Parts that do not fit are cut, the last ones first. Where no record file
    was written, the failures take the room: the line is all there is."""
    loaded = _loaded(record["actions"])
    outcome = record["summary"]
    if loaded:  # what was loaded says it: "supplying them (with the overlay)" need not
        outcome = outcome.split("; supplying them")[0].split("; would supply them")[0]
    unwritten = any(f.startswith(_NOT_WRITTEN) for f in record["failed"])
    parts = [f"tmaguard: {_clip(outcome)}", *loaded]
    parts += _first("FAILED", record["failed"], 240 if unwritten else 56)
    parts += _first("PROBLEM", record["unfixed"])
    parts += [phrase] if (phrase := _routing_phrase(record["routing"], record["tma"])) else []
    where = "no record file written" if unwritten else _record_file(record)
    tail = _clip(f"details: {where}", MESSAGE_LIMIT // 2)
    room = MESSAGE_LIMIT - len(tail)
    kept: list[str] = []
    for part in parts:
        left = room - sum(len(p) + 2 for p in kept) - 2
        if len(part) > left:
            kept += [_clip(part, left)] if left >= 24 else []
            break
        kept.append(part)
    return "; ".join([*kept, tail])


def _clip(text: str, limit: int = _PART_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _first(label: str, items: list[str], limit: int = 56) -> list[str]:
    if not items:
        return []
    count = f" ({len(items)})" if len(items) > 1 else ""
    return [f"{label}{count}: {_clip(items[0], limit)}"]


def _loaded(actions: list[str]) -> list[str]:
    """What was loaded (or would be, in validate mode), without paths."""
    loaded, shims = [], []
    for action in actions:
        if action.startswith("loaded the overlay"):
            memory = action.startswith("loaded the overlay /proc/self/fd/")  # no private directory for it
            loaded.append("overlay loaded" + (" (in memory)" if memory else ""))
        elif action.removeprefix("loaded ") in _SHIM_NAMES:
            shims.append(_SHIM_NAMES[action.removeprefix("loaded ")])
        elif action.startswith("would load "):
            loaded.append(action)
    return loaded + ([f"shims loaded ({', '.join(shims)})"] if shims else [])


def _routing_phrase(routing: dict[str, Any] | None, tma: dict[str, Any] | None) -> str | None:
    if routing is None:
        return None
    if routing["error"]:
        return f"routing ERROR: {_clip(routing['error'], 100)}"
    changes = []
    if routing["disabled_kernels"]:
        changes.append(f"{len(routing['disabled_kernels'])} kernels off")
    if any(name.endswith("USE_DEEP_GEMM") for name in routing["env"]):
        changes.append("DeepGEMM off")
    if routing["blocked_imports"]:
        changes.append(f"{len(routing['blocked_imports'])} extensions blocked")
    if not changes:
        changes.append("vLLM's own choices" + (", TMA kept" if tma and tma["usable"] else ""))
    counted = {"hint": routing["hints"], "override": routing["overrides"], "note": routing["stale"]}
    notes = [f"{len(items)} {what}{'s' * (len(items) > 1)}" for what, items in counted.items() if items]
    return "routing: " + ", ".join(changes + notes)


def _record_file(record: dict[str, Any]) -> str:
    """Where the full record is: the file the guard wrote, or the command that prints it."""
    if record.get("record_file"):
        return record["record_file"]
    if record["trigger"] == "cli":
        return "tmaguard check --json"
    directory = os.environ.get("TMAGUARD_RECORD_DIR") or default_record_dir()
    return os.path.join(directory, "last.json")


def _ensure_handler() -> None:
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


def log_line(level: str, message: str) -> None:
    _ensure_handler()
    logger.log(_LEVELS[level], redact(message), stacklevel=2)


def emit(record: dict[str, Any], level: str, log_format: str) -> None:
    """Logs a record from build_record (already redacted)."""
    _ensure_handler()
    text = json.dumps(record, sort_keys=False) if log_format == "json" else render_text(record)
    logger.log(_LEVELS[level], text)


PROCESS_RECORDS_KEPT = 64  # per-process records kept in the record directory, newest first


def process_record_path(record_dir: str, pid: int) -> str:
    return os.path.join(record_dir, f"process-{pid}.json")


def write_record(record: dict[str, Any], record_dir: str) -> str | None:
    """Writes the process's own record (process-<pid>.json) and replaces last.json, each atomically; keeps
    the newest PROCESS_RECORDS_KEPT process records. Returns the process record's path, or None if the
    directory is unusable."""
    try:
        os.makedirs(record_dir, mode=0o700, exist_ok=True)
        path = process_record_path(record_dir, record["pid"])
        for target in (path, os.path.join(record_dir, "last.json")):
            _write_atomically(record, record_dir, target)
    except OSError:
        return None
    _prune_process_records(record_dir)
    return path


def _write_atomically(record: dict[str, Any], record_dir: str, target: str) -> None:
    temporary = None
    try:
        fd, temporary = tempfile.mkstemp(dir=record_dir, prefix=".last.", suffix=".json")
        with os.fdopen(fd, "w") as file:
            json.dump(record, file, indent=1)  # from build_record: already redacted
        os.replace(temporary, target)
    except OSError:
        if temporary is not None:  # a full disk: leave no partial file behind
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        raise


def _prune_process_records(record_dir: str) -> None:
    with contextlib.suppress(OSError):
        entries = [
            e for e in os.scandir(record_dir) if e.name.startswith("process-") and e.name.endswith(".json")
        ]
        if len(entries) <= PROCESS_RECORDS_KEPT:
            return
        entries.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime, reverse=True)
        for entry in entries[PROCESS_RECORDS_KEPT:]:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
