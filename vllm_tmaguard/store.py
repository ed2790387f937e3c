"""Where the guard keeps what it writes (the overlay's file, the vLLM scan cache, each process's record): a
directory that is this user's alone. TMAGUARD_RECORD_DIR when it is such a directory, else the default one
with the refusal said; with neither, nothing is written and the overlay stays in memory."""

import os
from typing import NamedTuple

from .codes import RECORD_DIR_REFUSED, RECORD_NOT_WRITTEN
from .files import default_record_dir
from .outcomes import Problem
from .trust import private_dir, why_not_private


class RecordDir(NamedTuple):
    path: str | None  # None: no private directory could be had
    asked: str  # TMAGUARD_RECORD_DIR as set (or the default)
    refused: str | None = None  # why `asked` was refused

    def problem(self) -> Problem | None:
        if self.refused is None:
            return None
        instead = f"records go to {self.path} instead" if self.path else "no record is written anywhere"
        return Problem(
            RECORD_DIR_REFUSED,
            cause=f"TMAGUARD_RECORD_DIR is refused: {self.refused}",
            consequence=f"{instead}; `tmaguard doctor` reads that directory",
            fix="point TMAGUARD_RECORD_DIR at a directory only this user can enter (0700), or unset it",
            subject=self.asked,
        )


def open_record_dir(asked: str) -> RecordDir:
    path, refused = private_dir(asked)
    if refused is not None and asked != default_record_dir():
        path, _ = private_dir(default_record_dir())
    return RecordDir(path, asked, refused)


def record_dir_to_read(asked: str) -> RecordDir:
    """Where the guard put its records when TMAGUARD_RECORD_DIR is `asked`, creating nothing (the doctor):
    the asked directory if it is private or absent (no guard has written yet); else the default one the
    guard fell back to, with why."""
    if not os.path.lexists(asked) or asked == default_record_dir():
        return RecordDir(asked, asked, None)
    refused = why_not_private(asked) if os.path.isdir(asked) else f"{asked} is not a directory"
    return RecordDir(default_record_dir() if refused else asked, asked, refused)


def not_written(directory: str, error: OSError) -> Problem:
    """The problem of a record the directory refused (files.write_record raised `error`)."""
    return Problem(
        RECORD_NOT_WRITTEN,
        cause=f"could not write the record to {directory}: {error.strerror or error}",
        consequence="`tmaguard doctor` cannot read this process's record; the log line is all there is",
        fix="free space in, or give this user write access to, TMAGUARD_RECORD_DIR",
        subject=directory,
    )
