"""The verdict cache (docs/design.md §4.1). Every vLLM process of a pod (API server, EngineCore, each worker)
asks the same question of the same files, so the first full run's verdict is kept in the guard's private
directory and replayed by the processes after it while everything it was decided from is unchanged. A replay
costs a few dozen stat calls instead of the full run's imports and ELF reads.

What a verdict was decided from, observed alike when it is stored and when it is replayed:
  1. the process: the environment variables the stages read (LD_LIBRARY_PATH by its effect on the loader's
     search, unless the stages read more of it), the files loaded under the driver's name where one answers
     it, the working directory, the effective user, the interpreter, the vLLM package it would import and
     the command line's eager flag (process.py; its --config file's too, launch_file.py);
  2. files: every file input the full run read through the door, with what it looked like as it was read
     (stages/door.py's Notes: identity, size, modification and change times; a /proc file's content).
A verdict is replayed whole or not at all: the stored record with this process's pid, time and trigger, the
trust check of every library it loads run again, its changes made again, its record issued (issue.py);
anything different, and the full run decides (and replaces an entry or a cache file it cannot use).
Standard library only: every vLLM process imports it."""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

from . import __version__
from .files import (
    default_record_dir,
    observe,
    path_problem,
    private_problem,
    read_private_json,
)
from .issue import Issued, issue, level_of, render
from .process import (
    LIBRARY_PATH,
    add_arg,
    answering,
    block_import,
    config_path,
    eager_flag,
    find_package_dir,
    is_server,
    load_library,
    memory_settings,
    module_run,
    split_library_path,
)

CACHE_FILE = "verdicts.json"
CACHE_FORMAT = 4  # 4: variables shown, judged; 3: flags added; 2: the record alone, inputs as read, ctime
ENTRIES_KEPT = 4  # distinct process environments per pod (the API server's, its workers' after its knobs)


# ---------------------------------------------------------------------------------------------------------
# Observing the process


def observe_process(library: str, env_names: Iterable[str], env_prefixes: Iterable[str]) -> dict[str, Any]:
    """The process's side of the inputs (taken before the guard changes anything). A working directory that
    is gone is an input like any other (None)."""
    names, prefixes = frozenset(env_names), tuple(env_prefixes)
    environ = os.environ
    try:
        cwd: str | None = os.getcwd()
    except OSError:
        cwd = None
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
        **_command_line(sys.argv),  # eager: routing reads it (process.py); launch: memory.py
    }


def _command_line(argv: list[str]) -> dict[str, Any]:
    """What the command line tells vLLM that a stage reads: its eager flag, whether the process is a vLLM
    server's front and its memory flags. A `--config` file is read once, and only where one is named
    (launch_file.py, PyYAML), so that a replay's path imports neither otherwise."""
    module = module_run() if argv and argv[0] == "-m" else None
    if config_path(argv) is None:
        eager, (fraction, kv_cache) = eager_flag(argv), memory_settings(argv)
    else:
        from .launch_file import process_settings

        eager, fraction, kv_cache = process_settings(argv)
    launch = {"serve": is_server(argv, module), "fraction": fraction, "kv_cache": kv_cache}
    return {"eager": eager, "launch": launch}


def _loaded_as(library: str) -> list[str]:
    """The loaded files named like `library`, listed only where an object answers its name (RTLD_NOLOAD: a
    few microseconds; the loader's whole list costs a few hundred). A file so named that does not answer
    the name (loaded by a path, another SONAME) goes unseen here, though the full run counts it as mapped:
    either way a replay stays safe, the shims work anywhere and the overlay is checked to answer the name
    once loaded (redo)."""
    if answering(library) is None:
        return []
    from .loaded import mapped_named, read_loaded_objects  # rare here: the driver is loaded before the guard

    return list(mapped_named(library, read_loaded_objects()))


_NOT_THERE = ("error", errno.ENOENT), ("error", errno.ENOTDIR)


def library_path_view(library: str, value: str, cwd: str | None) -> list[list[Any]]:
    """What LD_LIBRARY_PATH (`value`) contributes to where `library` is loaded from: each of its candidates
    that is there (or cannot be looked at), observed, in order, up to an entry the loader expands ($ORIGIN
    & co.) or a relative one without a working directory; an entry without the file contributes nothing and
    is left out, so two processes whose variables differ only in such entries compare equal (opencv adds its
    own directory to its children's)."""
    view: list[list[Any]] = []
    for directory in split_library_path(value, cwd or ""):
        path = os.path.join(directory, library)
        if "$" in path or not os.path.isabs(path):
            return [*view, ["token", path]]
        seen = observe("stat", path)
        if tuple(seen) not in _NOT_THERE:
            view.append([path, seen])
    return view


# ---------------------------------------------------------------------------------------------------------
# The cache file


def replay_directory() -> str | None:
    """Where the full run kept its verdicts: TMAGUARD_RECORD_DIR, else the default it falls back to, when it
    is a directory this user alone can enter (the full run judged its whole path, and the stored inputs hold
    that path's components)."""
    asked = os.environ.get("TMAGUARD_RECORD_DIR", "").strip() or default_record_dir()
    for candidate in dict.fromkeys((asked, default_record_dir())):
        try:
            if os.path.isabs(candidate) and private_problem(os.lstat(candidate)) is None:
                return candidate
        except OSError:
            continue
    return None


def _shaped(entry: Any) -> bool:
    """An entry as the full run stores it (stages/pipeline.remember; a cache file is the guard's own, but may
    be damaged)."""
    try:
        redo, process = entry["redo"], entry["process"]
        return (
            isinstance(process["library"], str) and isinstance(process["env"], dict)
            and isinstance(process["env_names"], list) and isinstance(process["env_prefixes"], list)
            and all(isinstance(n, str) for n in [*process["env_names"], *process["env_prefixes"]])
            and isinstance(entry["files"], list)
            and all(_row(f, 3) and isinstance(f[1], str) for f in entry["files"])
            and isinstance(entry["record"], dict) and isinstance(entry["record"].get("pid"), int)
            and entry["log_format"] in ("text", "json") and isinstance(entry["secret_min"], int)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in entry["shown"].items())
            and isinstance(redo["load"], list) and isinstance(redo["args"], list)
            and all(_row(r, 3) and isinstance(r[0], str) and isinstance(r[1], bool) for r in redo["load"])
            and all(isinstance(k, str) and isinstance(v, str) for k, v in redo["env"].items())
            and isinstance(redo["block"], list) and all(isinstance(m, str) for m in redo["block"])
            and all(_row(r, 2) and isinstance(r[0], str) and isinstance(r[1], str) for r in redo["args"])
        )  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError):
        return False


def _row(value: Any, length: int) -> bool:
    """A list of `length` items, as json writes a tuple (a string of that length would unpack as well)."""
    return isinstance(value, list) and len(value) == length


def load_entries(directory: str) -> list[dict[str, Any]]:
    """The stored entries, newest first; none when the file is absent, unsafe (files.read_private), damaged
    or of another format or version (the next full run replaces it)."""
    try:
        document = read_private_json(directory, CACHE_FILE)
    except (OSError, ValueError):
        return []
    if not isinstance(document, dict):
        return []
    if document.get("format") != CACHE_FORMAT or document.get("tmaguard") != __version__:
        return []
    entries = document.get("entries")
    return [e for e in entries if _shaped(e)] if isinstance(entries, list) else []


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
        if all(observe(kind, path) == observed for kind, path, observed in entry["files"]):
            return entry
    return None


def _replayable_here(entry: dict[str, Any], text: str) -> bool:
    """What the stored inputs cannot tell: that no module to block is imported yet, that every library to
    load is still trusted (files.path_problem: its path's owners and modes, checked again), and that no
    secret of this process's environment appears in the stored record (`text`: it was redacted against
    another's). Of the variables the stages do not read (those are the same as the storing process's) whose
    values appear in it, few or none, only those the storing process did not have (its `shown`, each judged
    no secret by redaction.secret_values, a function of the name and value alone) are asked whether they
    are secrets."""
    redo = entry["redo"]
    if any(sys.modules.get(module) is not None for module in redo["block"]):
        return False
    if any(path_problem(path) is not None for path, _, _ in redo["load"]):
        return False
    judged = entry["shown"]
    unjudged = {
        name: value
        for name, value in shown_variables(text, entry["process"]["env"], entry["secret_min"]).items()
        if judged.get(name) != value
    }
    if not unjudged:
        return True
    from .redaction import secret_values

    return not secret_values(unjudged)


def shown_variables(text: str, same: dict[str, str], shortest: int) -> dict[str, str]:
    """This process's environment variables other than `same` (the stages' inputs) whose values, at least
    `shortest` characters long, appear in the record `text` (JSON): few or none (LD_LIBRARY_PATH's
    directories, say)."""
    return {k: v for k, v in os.environ.items() if k not in same and len(v) >= shortest and _in_json(v, text)}


def _in_json(value: str, text: str) -> bool:
    """Whether `value` appears in `text`, JSON as json.dumps writes it: a non-ASCII character, a quote, a
    backslash or a control character there is escaped (the raw value would never be found)."""
    if value in text:  # as written (or escaping changes nothing): found either way
        return True
    plain = value.isascii() and value.isprintable() and '"' not in value and "\\" not in value
    return not plain and json.dumps(value)[1:-1] in text


def _issuable(record: dict[str, Any]) -> str | None:
    """The stored record as JSON where it can be written and logged as it is, tried before anything is
    changed; None for a damaged one (a field its line reads missing or of another type, nesting the encoder
    refuses), which sends the process to the full run, which replaces the entry, instead of failing after its
    libraries are loaded."""
    try:
        text = json.dumps(record)
        level_of(record)
        render(record)
    except Exception:  # whatever a damaged document raises (KeyError, TypeError, RecursionError...)
        return None
    return text


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
    for flag, value in plan["args"]:
        add_arg(flag, value)
    return True


def for_process(document: dict[str, Any], trigger: str, **fields: Any) -> dict[str, Any]:
    """A decided record as this process's: its pid, time and trigger, no record file yet."""
    return {
        **document,
        "pid": os.getpid(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "trigger": trigger,
        "record_file": None,
        **fields,
    }


def replay(trigger: str) -> Issued | None:
    """This process's record from the cache, done and issued; None where there is no matching verdict or it
    could not be replayed whole (a library that does not load as it did leaves the rest to the full run,
    which issues this process's record)."""
    started = time.perf_counter()
    directory = replay_directory()
    entry = _matching(load_entries(directory)) if directory else None
    if entry is None or directory is None:
        return None
    text = _issuable(entry["record"])
    if text is None or not _replayable_here(entry, text):
        return None
    if not redo(entry["redo"]):
        return None
    stored = entry["record"]
    elapsed = round((time.perf_counter() - started) * 1e3, 3)
    document = for_process(
        stored, trigger, replayed_from=stored["pid"], timings_ms={"replay": elapsed}, elapsed_ms=elapsed
    )
    return issue(document, directory, entry["log_format"])
