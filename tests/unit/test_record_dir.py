"""A refused record directory is described as it is, and the guard falls back to the default one with a
problem saying so (store.py over trust.private_dir)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllm_tmaguard.codes import RECORD_DIR_REFUSED
from vllm_tmaguard.files import default_record_dir
from vllm_tmaguard.stages import store
from vllm_tmaguard.stages.store import open_record_dir


def _everyone(path: Path) -> Path:
    path.mkdir()
    path.chmod(0o777)
    return path


def _group(path: Path) -> Path:
    path.mkdir()
    path.chmod(0o770)
    return path


def _file(path: Path) -> Path:
    path.write_text("")
    return path


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (_everyone, "has mode 0777: everyone can enter it; it must be 0700 (this user's alone)"),
        (_group, "has mode 0770"),
        (_file, "is a regular file, not a directory"),
    ],
)
def test_refusal_says_why_and_where_records_go_instead(tmp_path: Path, monkeypatch, make, why: str) -> None:
    # The default directory is the test's own: the user's /tmp/tmaguard-<uid> is never made or written.
    default = str(tmp_path / "default")
    monkeypatch.setattr(store, "default_record_dir", lambda: default)
    asked = make(tmp_path / "records")
    records = open_record_dir(str(asked))
    problem = records.problem()
    assert problem is not None and problem.code == RECORD_DIR_REFUSED and problem.subject == str(asked)
    assert problem.cause.startswith(f"TMAGUARD_RECORD_DIR is refused: {asked} ") and why in problem.cause
    assert records.path == default and os.stat(default).st_mode & 0o777 == 0o700
    assert f"records go to {records.path} instead" in problem.consequence


def test_the_default_directory_is_the_users_own_in_tmp() -> None:
    assert default_record_dir() == f"/tmp/tmaguard-{os.getuid()}"


def test_a_private_directory_is_taken(tmp_path: Path) -> None:
    records = open_record_dir(str(tmp_path / "records"))
    assert records.path == str(tmp_path / "records") and records.problem() is None
    assert (tmp_path / "records").stat().st_mode & 0o777 == 0o700
