"""The files the guard keeps in its private directory, and how it writes them: atomically (a temporary file
in the same directory renamed over the target, so a reader sees the old file or the whole new one, and a
failed write leaves nothing); each process's record, process-<pid>.json, and last.json (what `tmaguard
doctor` reads first), the newest PROCESS_RECORDS_KEPT process records kept. Standard library only: every
vLLM process writes its record."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from typing import Any

PROCESS_RECORDS_KEPT = 64  # per-process records kept in the record directory, newest first
_temporaries = itertools.count()


def write_atomically(path: str, data: bytes, mode: int | None = None) -> None:
    """Writes `data` to `path` (optionally chmod `mode` before the rename). Raises OSError."""
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.{next(_temporaries)}")
    fd = _create(temporary)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _create(temporary: str) -> int:
    """A new file, never through a link; one left behind by a dead process of the same pid is replaced."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(temporary, flags, 0o600)
    except FileExistsError:
        os.unlink(temporary)
        return os.open(temporary, flags, 0o600)


def default_record_dir() -> str:
    """TMAGUARD_RECORD_DIR's default."""
    return f"/tmp/tmaguard-{os.getuid()}"


def process_record_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"process-{pid}.json")


def write_record(document: dict[str, Any], directory: str, pid: int) -> None:
    """Writes the process's own record and makes last.json the same file; neither, when the directory
    refuses either (OSError)."""
    own, data = process_record_path(directory, pid), json.dumps(document).encode()
    write_atomically(own, data)
    try:
        _replace_last(own, directory, data)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(own)
        raise
    _prune(directory)


def _replace_last(own: str, directory: str, data: bytes) -> None:
    last = os.path.join(directory, "last.json")
    temporary = os.path.join(directory, f".last.json.{os.getpid()}.{next(_temporaries)}")
    try:
        os.link(own, temporary)
        os.replace(temporary, last)
    except OSError:  # a file system without hard links, or something in the way
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        write_atomically(last, data)


def _prune(directory: str) -> None:
    with contextlib.suppress(OSError):
        names = [n for n in os.listdir(directory) if n.startswith("process-") and n.endswith(".json")]
        if len(names) <= PROCESS_RECORDS_KEPT:
            return
        entries = [e for e in os.scandir(directory) if e.name in names]
        entries.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime, reverse=True)
        for entry in entries[PROCESS_RECORDS_KEPT:]:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
