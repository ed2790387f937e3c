"""How the record's line is logged (issue.log): written directly in vLLM's format where the line is the
guard's own to write (what logging's StreamHandler made of it, to the character, without its cost in every
process), and handed to logging where the user runs their own configuration (VLLM_CONFIGURE_LOGGING=0, or
handlers on the vllm_tmaguard logger)."""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Iterator

import pytest

from vllm_tmaguard import issue

LOGGER = logging.getLogger("vllm_tmaguard")


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def user_handler() -> Iterator[list[logging.LogRecord]]:
    """A handler of the user's own on the vllm_tmaguard logger: what reaches it."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.DEBUG)
    yield records
    LOGGER.removeHandler(handler)
    LOGGER.setLevel(logging.NOTSET)


def _as_logging_formats(level: str, text: str, lineno: int, created: float) -> str:
    """The line logging's Formatter makes in issue's format, for a record logged here at `lineno`."""
    record = logging.LogRecord("vllm_tmaguard", issue.LEVELS[level], __file__, lineno, text, None, None)
    record.created = created
    return logging.Formatter(issue._LINE_FORMAT, issue._DATE_FORMAT).format(record)


@pytest.mark.parametrize("level", ["info", "warning", "error"])
def test_the_guards_own_line_is_what_logging_would_write(environment, capsys, level: str) -> None:
    lineno = sys._getframe().f_lineno + 1
    issue.log(level, "tmaguard: a line")
    (written,) = capsys.readouterr().out.splitlines()
    # The time is the one field two calls differ in: the line's own, to the second, as logging writes it.
    stamp = re.search(r" (\d\d-\d\d \d\d:\d\d:\d\d) ", written)
    assert stamp is not None, written
    now = time.localtime()
    created = time.mktime(time.strptime(f"{now.tm_year}-{stamp.group(1)}", "%Y-%m-%d %H:%M:%S"))
    assert abs(created - time.time()) < 5
    assert written == _as_logging_formats(level, "tmaguard: a line", lineno, created)
    assert written.startswith(f"(tmaguard pid={os.getpid()}) {level.upper()} ")
    assert f"[test_log_line.py:{lineno}]" in written


def test_debug_lines_only_with_vllms_debug_level(environment, capsys) -> None:
    issue.log("debug", "tmaguard: quiet")
    assert capsys.readouterr().out == ""
    environment.setenv("VLLM_LOGGING_LEVEL", "debug")
    issue.log("debug", "tmaguard: heard")
    assert capsys.readouterr().out.rstrip().endswith("] tmaguard: heard")


def test_a_user_handler_gets_the_line_through_logging(environment, capsys, user_handler) -> None:
    issue.log("warning", "tmaguard: for the user's handler")
    assert capsys.readouterr().out == ""
    (record,) = user_handler
    assert (record.levelno, record.getMessage()) == (logging.WARNING, "tmaguard: for the user's handler")
    assert record.filename == "test_log_line.py"  # the caller's place, as the direct line names it


def test_vllm_configure_logging_0_hands_the_line_to_the_root_logger(environment, capsys, caplog) -> None:
    environment.setenv("VLLM_CONFIGURE_LOGGING", "0")
    with caplog.at_level(logging.INFO):
        issue.log("info", "tmaguard: for the root logger")
    assert capsys.readouterr().out == ""
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("vllm_tmaguard", "tmaguard: for the root logger")
    ]


def test_no_stdout_loses_the_line_and_nothing_else(environment, monkeypatch) -> None:
    monkeypatch.setattr("sys.stdout", None)
    issue.log("warning", "tmaguard: nowhere to go")  # no exception: the record file is what remains
