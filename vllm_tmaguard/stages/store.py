"""Where the guard keeps what it writes (the overlay's file, the vLLM scan cache, each process's record): a
directory that is this user's alone. TMAGUARD_RECORD_DIR when it is such a directory, else the default one
with the refusal said; with neither, nothing is written and the overlay stays in memory. The same judgement
for every reader and writer of the directory (trust.py), the default directory included."""

import os

from ..codes import RECORD_DIR_REFUSED
from ..files import default_record_dir
from .outcomes import Problem
from .trust import private_dir, why_not_private
from .values import value_type


@value_type
class RecordDir:
    path: str | None  # None: no private directory could be had
    asked: str  # TMAGUARD_RECORD_DIR as set (or the default)
    refused: str | None = None  # why `asked` was refused

    def problem(self) -> Problem | None:
        if self.refused is None:
            return None
        instead = f"records go to {self.path} instead" if self.path else "no record is written anywhere"
        default = self.asked == default_record_dir()
        which = "the default record directory" if default else "TMAGUARD_RECORD_DIR"
        fix = (
            f"remove {self.asked} (made by another user, or with the wrong mode) or set TMAGUARD_RECORD_DIR "
            "to a directory only this user can enter (0700)"
            if default
            else "point TMAGUARD_RECORD_DIR at a directory only this user can enter (0700)"
            + (", or unset it" if self.path else "")
        )
        return Problem(
            RECORD_DIR_REFUSED,
            cause=f"{which} is refused: {self.refused}",
            consequence=f"{instead}; `tmaguard doctor` reads that directory",
            fix=fix,
            subject=self.asked,
        )


def open_record_dir(asked: str) -> RecordDir:
    path, refused = private_dir(asked)
    if refused is not None and asked != default_record_dir():
        path, instead = private_dir(default_record_dir())
        refused = _also(refused, instead)
    return RecordDir(path, asked, refused)


def _also(refused: str, fallback_refused: str | None) -> str:
    """Why the asked directory was refused, and why the default one the guard falls back to was refused
    too, where it was (a co-tenant may have made it first: the operator must know to remove it)."""
    return refused if fallback_refused is None else f"{refused}; the fallback too: {fallback_refused}"


def record_dir_to_read(asked: str) -> RecordDir:
    """Where the guard put its records when TMAGUARD_RECORD_DIR is `asked` (the doctor, `tmaguard record`,
    the preflight), creating nothing and judged as the guard judges it, the default directory too: the asked
    directory if it is private or absent (no guard has written yet); else the default one the guard fell
    back to, if that is private or absent; else none (path None), with why."""
    refused = _refusal(asked)
    if refused is None:
        return RecordDir(_real(asked), asked, None)
    default = default_record_dir()
    if asked == default:
        return RecordDir(None, asked, refused)
    instead = _refusal(default)
    return RecordDir(None if instead else _real(default), asked, _also(refused, instead))


def _refusal(path: str) -> str | None:
    if not os.path.isabs(path):
        return f"{path!r} is not an absolute path"
    return why_not_private(path) if os.path.lexists(path) else None


def _real(path: str) -> str:
    return os.path.realpath(path) if os.path.lexists(path) else path
