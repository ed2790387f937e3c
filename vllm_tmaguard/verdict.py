"""The verdict cache (docs/design.md §4.1). Every vLLM process of a pod (API server, EngineCore, each worker)
asks the same question of the same files, so the first full run's verdict is kept in the guard's private
directory and replayed by the processes after it while everything it was decided from is unchanged. A replay
costs a few dozen stat calls instead of the full run's imports and ELF reads.

What a verdict was decided from, observed alike when it is stored and when it is replayed:
  1. the process: the environment variables the stages read (LD_LIBRARY_PATH by its effect on the loader's
     search, unless the stages read more of it), the files loaded under the driver's name where one answers
     it, the working directory, the effective user, the interpreter and the vLLM package it would import;
  2. files: what inputs.py lists (observe_file: stat, owner, existence, entries, a /proc file's content).
Which variables, names and files is the full run's to say (inputs.py, actions.replay_plan); this module
observes, compares and redoes. A verdict is replayed whole or not at all: the stored record with this
process's pid, time and trigger, its changes made again, its line logged; anything different, and the full
run decides.

Also how a verdict is issued, the full run's too: its record file and its one log line in vLLM's style.
Long because every vLLM process imports it: standard library only, no value types, one module fewer to
load (each costs a quarter of a millisecond on a GPU host)."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import sys
import time
from collections.abc import Iterable
from typing import Any

from . import __version__
from .files import default_record_dir, process_record_path, write_atomically, write_record
from .process import (
    LIBRARY_PATH,
    answering,
    block_import,
    find_package_dir,
    load_library,
    mapped_named,
    read_loaded_objects,
    split_library_path,
)

CACHE_FILE = "verdicts.json"
_CACHE_FORMAT = 1
ENTRIES_KEPT = 4  # distinct process environments per pod (the API server's, its workers' after its knobs)


class Verdict:
    """A decided record as logged and written: the record document (record.Record.to_json), its log level,
    its log line's parts (record.line_parts: rendered from the record's fields) and the log format."""

    __slots__ = ("essential", "level", "log_format", "optional", "record")

    def __init__(
        self, record: dict[str, Any], level: str, essential: list[str], optional: list[str], log_format: str
    ) -> None:
        self.record, self.level, self.log_format = record, level, log_format
        self.essential, self.optional = essential, optional

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        return cls(data["record"], data["level"], data["essential"], data["optional"], data["log_format"])

    def for_process(self, trigger: str, **fields: Any) -> Verdict:
        """This verdict as this process's: its pid, time and trigger, no record file yet."""
        record = {
            **self.record,
            "pid": os.getpid(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "trigger": trigger,
            "record_file": None,
            **fields,
        }
        return Verdict(record, self.level, self.essential, self.optional, self.log_format)


# ---------------------------------------------------------------------------------------------------------
# The log line: the vllm_tmaguard logger in vLLM's format; its parts (record.line_parts) fitted to its limit
logger = logging.getLogger("vllm_tmaguard")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
# vLLM's own format (vllm/logger.py), so the line sits naturally among vLLM's.
_LINE_FORMAT = "(tmaguard pid=%(process)d) %(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
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
    handler.setFormatter(logging.Formatter(_LINE_FORMAT, _DATE_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(
        logging.DEBUG if os.environ.get("VLLM_LOGGING_LEVEL", "").upper() == "DEBUG" else logging.INFO
    )
    logger.propagate = False


def log(level: str, message: str) -> None:
    """Logs one line at `level` (a key of LEVELS). The caller has redacted it."""
    ensure_handler()
    logger.log(LEVELS[level], message, stacklevel=2)


def written(verdict: Verdict, directory: str) -> Verdict:
    """The verdict with its record written to `directory` (process-<pid>.json and last.json). Raises OSError
    where the directory refuses; the verdict is then unchanged."""
    path = process_record_path(directory, verdict.record["pid"])
    write_record({**verdict.record, "record_file": path}, directory, verdict.record["pid"])
    verdict.record["record_file"] = path
    return verdict


def announce(verdict: Verdict) -> None:
    """Logs the verdict's one line (TMAGUARD_LOG_FORMAT=json: the whole record)."""
    if verdict.log_format == "json":
        text = json.dumps(verdict.record)
    else:
        text = fit_line(verdict.essential, [*verdict.optional, details(verdict.record["record_file"])])
    log(verdict.level, text)


# ---------------------------------------------------------------------------------------------------------
# Observing


def observe_file(kind: str, path: str) -> list[Any] | str:
    """One file input as JSON: ("stat") the file's identity, size and modification time, links followed;
    ("owner") the component's identity, type, mode and owner, links not followed; ("exists") whether it
    does; ("list") a directory's sorted entries; ("read") the content; or the error number."""
    if kind == "exists":
        return [os.path.exists(path)]
    try:
        if kind == "read":
            with open(path, "rb") as file:
                return file.read().decode("utf-8", "replace")
        if kind == "list":
            return sorted(os.listdir(path))
        if kind == "owner":
            info = os.lstat(path)
            return [info.st_mode, info.st_ino, info.st_dev, info.st_uid, info.st_gid]
        info = os.stat(path)
    except OSError as error:
        return ["error", error.errno]
    return [info.st_mode, info.st_ino, info.st_dev, info.st_size, info.st_mtime_ns, info.st_uid, info.st_gid]


def observe_process(library: str, env_names: Iterable[str], env_prefixes: Iterable[str]) -> dict[str, Any]:
    """The process's side of the inputs (taken before the guard changes anything)."""
    names, prefixes = frozenset(env_names), tuple(env_prefixes)
    environ, cwd = os.environ, os.getcwd()
    return {
        "library": library,
        "env_names": sorted(names),
        "env_prefixes": list(prefixes),
        "env": {k: environ[k] for k in environ if k in names or k.startswith(prefixes)},
        "library_path": library_path_view(library, environ.get(LIBRARY_PATH, ""), cwd),
        "mapped": _loaded_as(library),
        "cwd": cwd,
        "euid": os.geteuid(),
        "python": [sys.executable, sys.version],
        "vllm": find_package_dir("vllm"),
    }


def _loaded_as(library: str) -> list[str]:
    """The loaded files named like `library`, listed only where an object answers its name (RTLD_NOLOAD: a
    few microseconds; the loader's whole list costs a few hundred). A file so named that does not answer
    the name (loaded by a path, another SONAME) goes unseen here, though the full run counts it as mapped:
    either way a replay stays safe, the shims work anywhere and the overlay is checked to answer the name
    once loaded (redo)."""
    if answering(library) is None:
        return []
    return list(mapped_named(library, read_loaded_objects()))


_NOT_THERE = ("error", errno.ENOENT), ("error", errno.ENOTDIR)


def library_path_view(library: str, value: str, cwd: str) -> list[list[Any]]:
    """What LD_LIBRARY_PATH (`value`) contributes to where `library` is loaded from: each of its candidates
    that is there (or cannot be looked at), observed, in order, up to an entry the loader expands ($ORIGIN
    & co.); an entry without the file contributes nothing and is left out, so two processes whose variables
    differ only in such entries compare equal (opencv adds its own directory to its children's)."""
    view: list[list[Any]] = []
    for directory in split_library_path(value, cwd):
        path = os.path.join(directory, library)
        if "$" in path:
            return [*view, ["token", path]]
        seen = observe_file("stat", path)
        if tuple(seen) not in _NOT_THERE:
            view.append([path, seen])
    return view


def by_effect(process: dict[str, Any]) -> dict[str, Any]:
    """A process observation that compares LD_LIBRARY_PATH by its effect on the loader's search alone
    (library_path), for a verdict whose stages read nothing else of it."""
    names = [name for name in process["env_names"] if name != LIBRARY_PATH]
    env = {name: value for name, value in process["env"].items() if name != LIBRARY_PATH}
    return {**process, "env_names": names, "env": env}


# ---------------------------------------------------------------------------------------------------------
# The cache file


def _cache_path(directory: str) -> str:
    return os.path.join(directory, CACHE_FILE)


def _private_dir_asked() -> str | None:
    """TMAGUARD_RECORD_DIR (or its default) when it is a directory this user alone can enter; the full run
    judged its whole path when it stored there, and the stored inputs hold that path's components."""
    asked = os.environ.get("TMAGUARD_RECORD_DIR", "").strip() or default_record_dir()
    try:
        info = os.stat(asked)
    except OSError:
        return None
    private = stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077
    return asked if os.path.isabs(asked) and private else None


def _load(directory: str) -> list[dict[str, Any]]:
    """The stored entries, newest first; none when the file is absent, not this user's alone, or not ours."""
    try:
        fd = os.open(_cache_path(directory), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            return []
        try:
            document = json.loads(file.read())
        except ValueError:
            return []
    if document.get("format") != _CACHE_FORMAT or document.get("tmaguard") != __version__:
        return []
    return document.get("entries") or []


def remember(
    directory: str,
    process: dict[str, Any],
    inputs: Iterable[tuple[str, str]],
    verdict: Verdict,
    replaying: dict[str, Any],
) -> None:
    """Stores a full run's verdict with what it was decided from (`process`, observed before the run;
    `inputs`, observed now, after it: the overlay's file it wrote is part of the state a replay finds) and
    what a replay needs: `replaying["redo"]` (actions.replay_plan), `replaying["secret_min"]` (the shortest
    value redaction counts as a secret). A failure only costs later processes their full run."""
    entry = {"process": process, "files": observe_files(inputs), "verdict": verdict.to_json(), **replaying}
    others = [e for e in _load(directory) if e.get("process") != process]
    document = {"format": _CACHE_FORMAT, "tmaguard": __version__, "entries": [entry, *others][:ENTRIES_KEPT]}
    with contextlib.suppress(OSError):
        write_atomically(_cache_path(directory), json.dumps(document).encode())


def observe_files(inputs: Iterable[tuple[str, str]]) -> list[list[Any]]:
    return [[kind, path, observe_file(kind, path)] for kind, path in inputs]


# ---------------------------------------------------------------------------------------------------------
# Replaying


def _matching(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first entry whose every input is as observed now."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for entry in entries:
        stored = entry["process"]
        key = (stored["library"], tuple(stored["env_names"]), tuple(stored["env_prefixes"]))
        if key not in seen:
            seen[key] = observe_process(*key)
        if seen[key] != stored:
            continue
        if all(observe_file(kind, path) == observed for kind, path, observed in entry["files"]):
            return entry
    return None


def _replayable_here(entry: dict[str, Any]) -> bool:
    """What the stored inputs cannot tell: that no module to block is imported yet, and that no secret of
    this process's environment appears in the stored record (it was redacted against another's). Only the
    variables the stages do not read (those are the same as the storing process's) whose values appear in
    it, few or none, are asked whether they are secrets."""
    if any(sys.modules.get(module) is not None for module in entry["redo"]["block"]):
        return False
    text, shortest, same = json.dumps(entry["verdict"]), entry["secret_min"], entry["process"]["env"]
    appearing = {k: v for k, v in os.environ.items() if k not in same and len(v) >= shortest and v in text}
    if not appearing:
        return True
    from .redaction import secret_values

    return not secret_values(appearing)


def redo(plan: dict[str, Any]) -> bool:
    """Makes the plan's changes again, in the full run's order; False (the full run then decides) when a
    library does not load as it did."""
    for path, global_scope, must_answer in plan["load"]:
        try:
            handle = load_library(path, global_scope)
        except OSError:
            return False
        if must_answer and answering(must_answer) != handle:
            return False
    os.environ.update(plan["env"])
    for module in plan["block"]:
        block_import(module)
    return True


def replay(trigger: str) -> tuple[Verdict, str] | None:
    """This process's verdict from the cache, written, done and logged, with the directory it was written
    to; None where there is no matching verdict or it could not be replayed whole (a refused write changes
    nothing; a library that does not load as it did leaves the rest to the full run, which writes this
    process's record again)."""
    started = time.perf_counter()
    directory = _private_dir_asked()
    entry = _matching(_load(directory)) if directory else None
    if entry is None or directory is None or not _replayable_here(entry):
        return None
    stored = Verdict.from_json(entry["verdict"])
    elapsed = round((time.perf_counter() - started) * 1e3, 3)
    verdict = stored.for_process(
        trigger, replayed_from=stored.record["pid"], timings_ms={"replay": elapsed}, elapsed_ms=elapsed
    )
    try:
        written(verdict, directory)
    except OSError:
        return None
    if not redo(entry["redo"]):
        return None
    announce(verdict)
    return verdict, directory
