"""Issuing a verdict: the record written to the private directory (process-<pid>.json, and last.json, what
`tmaguard doctor` reads first) and its one line logged (line.py). One function for every process: the full
run's, a replay's, a forked child's. A record the directory refuses is a problem of that record
(RECORD_NOT_WRITTEN), logged with it. Standard library only: every vLLM process issues its verdict."""

from __future__ import annotations

import json
import os
from typing import Any

from .codes import RECORD_NOT_WRITTEN
from .files import private
from .line import announce


class Issued:
    """A process's verdict as issued: its record document, where it was written (None: nowhere), and the log
    format it was logged in (a forked child issues its own record the same way). A plain class: a NamedTuple
    costs a millisecond to define, in every vLLM process."""

    __slots__ = ("directory", "document", "log_format")

    def __init__(self, document: dict[str, Any], directory: str | None, log_format: str) -> None:
        self.document, self.directory, self.log_format = document, directory, log_format


PROCESS_RECORDS_KEPT = 64  # per-process records kept in the record directory, newest first
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
        opened.prune("process-", ".json", PROCESS_RECORDS_KEPT)
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
