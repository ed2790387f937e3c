"""Damaged files in the guard's record directory (issue 25, items 8, 9 and 10): a FIFO, a link to /dev/zero,
JSON of the wrong shape or nested past any parser's patience, where the guard keeps its records, its verdict
cache and its vLLM scan cache. No process may hang or crash on them: a vLLM process decides as if they were
absent (and replaces them), `tmaguard doctor` reports each as a finding with its fix, `tmaguard record` says
why it prints nothing. Every command runs with a bound on its time (a hang fails the test promptly) and on
its memory (advkit_b.tmaguard)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from advkit_b import (
    ACTIVATE,
    PRINT_MAPS,
    SAYS_PID,
    decided_afresh,
    own_pid,
    own_record,
    tmaguard,
)
from test_guard_vllm import RESOLVE_PLATFORM

VLLM_START = SAYS_PID + RESOLVE_PLATFORM + PRINT_MAPS
VLLM_START_S = 60  # a vLLM process starts in a few seconds here; past this, it hangs
COMMAND_S = 20  # `tmaguard doctor` (passive) and `tmaguard record` answer well under a second


def _record_dir(tmp_path: Path) -> Path:
    """The record directory run_python and advkit_b.tmaguard use, made as the guard makes it (0700)."""
    records = tmp_path / "records"
    records.mkdir(mode=0o700, exist_ok=True)
    return records


def _starts_with_the_fix(run, vllm: bool = True) -> dict:
    """vLLM started (its CUDA extension imported) with the overlay loaded; the process's record. For a run of
    the guard alone (`vllm` False: ACTIVATE), the overlay loaded, with which vLLM starts on a vCUDA pod."""
    if vllm:
        assert "error" not in run.result, run.result
    (line,) = [line for line in run.guard_lines() if f"pid={own_pid(run)})" in line]
    assert "overlay loaded" in line, line
    return own_record(run)


def _json_object(path: Path) -> dict:
    document = json.loads(path.read_text())
    assert isinstance(document, dict) and path.is_file() and not path.is_symlink()
    return document


@pytest.mark.parametrize("cache", ["verdicts.json", "the vLLM scan cache"])
def test_a_fifo_where_a_cache_belongs_hangs_no_vllm_process(pods, run_python, tmp_path, cache) -> None:
    """Item 8: a FIFO named verdicts.json in the record directory hung every vLLM process at start (opened
    without O_NONBLOCK before the type check); the vLLM scan cache was opened the same way. Attack: the
    cache's name made a FIFO with no writer (for the scan cache, after a first process wrote it, with the
    verdicts gone so that the next one reads it). The next vLLM process must start within the bound, with
    the guard's fix, replace the FIFO with a valid cache, and the process after it replay; the doctor names
    such a FIFO, with its fix."""
    pod = pods("vcuda", cc="9.0")
    records = _record_dir(tmp_path)
    if cache == "verdicts.json":
        fifo = records / "verdicts.json"
    else:
        run_python(pod, ACTIVATE, timeout=VLLM_START_S)
        (fifo,) = records.glob("vllm-scan-*.json")
        fifo.unlink()
        (records / "verdicts.json").unlink()
    os.mkfifo(fifo, 0o600)

    # The guard reads both caches in its activation, before vLLM's own code: vLLM's start once (the
    # verdicts), the guard alone for the scan cache.
    starts_vllm = cache == "verdicts.json"
    started = run_python(pod, VLLM_START if starts_vllm else ACTIVATE, timeout=VLLM_START_S)
    decided = _starts_with_the_fix(started, starts_vllm)
    assert decided_afresh(decided)
    assert _json_object(fifo) and _json_object(records / "verdicts.json")["entries"]
    later = run_python(pod, ACTIVATE, timeout=VLLM_START_S)
    assert own_record(later)["replayed_from"] == decided["pid"]

    fifo.unlink()  # the doctor, asked while the FIFO is there, names it
    os.mkfifo(fifo, 0o600)
    doctor = tmaguard(pod, records, "doctor", "--json", timeout=COMMAND_S)
    (found,) = [f for f in json.loads(doctor.stdout)["findings"] if f["subject"] == str(fifo)]
    assert found["id"] == "cache-unusable" and "FIFO" in found["detail"] and str(fifo) in found["fix"]["text"]


@pytest.mark.parametrize("kind", ["a FIFO", "a link to /dev/zero"])
def test_the_doctor_and_record_answer_on_a_last_json_that_never_ends(pods, tmp_path, kind) -> None:
    """Item 8: last.json as a FIFO hung `tmaguard doctor` and `tmaguard record`; as a link to /dev/zero they
    read until MemoryError. Now each answers within the bound: the doctor with a finding that names the file
    and its fix (exit 1: findings), `tmaguard record` with why it prints no record (exit 1)."""
    pod = pods("vcuda", cc="9.0")
    records = _record_dir(tmp_path)
    last = records / "last.json"
    if kind == "a FIFO":
        os.mkfifo(last, 0o600)
    else:
        last.symlink_to("/dev/zero")
    why = "FIFO" if kind == "a FIFO" else "symbolic link"

    report = tmaguard(pod, records, "doctor", "--json", timeout=COMMAND_S)
    assert report.returncode == 1, report.stderr
    found = [f for f in json.loads(report.stdout)["findings"] if f["id"] == "record-unreadable"]
    assert [f["subject"] for f in found] == [str(last)] and why in found[0]["detail"]
    assert f"Remove {last}" in found[0]["fix"]["text"]
    text = tmaguard(pod, records, "doctor", timeout=COMMAND_S)
    folded = "".join(text.stdout.split())  # the readable report folds a long path across its lines
    assert text.returncode == 1 and "internal error" not in text.stderr and str(last) in folded
    printed = tmaguard(pod, records, "record", timeout=COMMAND_S)
    assert printed.returncode == 1 and printed.stdout == ""
    assert str(last) in printed.stderr and why in printed.stderr and "internal error" not in printed.stderr


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


# Valid JSON, not a record: damage -> what last.json holds, from a real record written by the guard.
WRONG_SHAPES = {
    "an empty list": lambda record: "[]",
    "schema 2 alone": lambda record: '{"schema": 2}',
    "a field of the wrong type": lambda record: json.dumps({**record, "problems": "none"}),
    "a number where an object is": lambda record: json.dumps({**record, "libcuda": 1}),
    "nested 100000 deep": lambda record: "[" * 100000,
    "a record nesting 900 deep in a free field": lambda record: json.dumps({**record, "vllm": _nested(900)}),
}


@pytest.mark.parametrize("damage", WRONG_SHAPES)
def test_the_doctor_answers_on_a_last_json_of_the_wrong_shape(pods, run_python, tmp_path, damage) -> None:
    """Item 9: last.json holding valid JSON of the wrong shape made the doctor say `internal error:
    KeyError: 'problems'` with exit 1 (the status of findings) and no report, and print nothing with --json.
    Attack: a real record's last.json replaced by each shape (a record nesting 900 levels in a field the
    readers do not check made the text doctor fail on recursion). Now the doctor reports a finding with its
    fix (exit 1, never 3), --json prints a valid report, `tmaguard record` exits 1 and says why."""
    pod = pods("vcuda", cc="9.0")
    run = run_python(pod, ACTIVATE, timeout=VLLM_START_S)
    last = run.record_dir / "last.json"
    written = json.loads(last.read_text())
    last.unlink()  # a hard link to the process's own record: that one stays as it is
    last.write_text(WRONG_SHAPES[damage](written))

    report = tmaguard(pod, run.record_dir, "doctor", "--json", timeout=COMMAND_S)
    assert report.returncode == 1, report.stderr
    parsed = json.loads(report.stdout)
    assert parsed["exit_code"] == 1 and parsed["record"]["record"] is None
    (found,) = [f for f in parsed["findings"] if f["id"] == "record-unreadable"]
    assert found["subject"] == str(last) and found["severity"] == "warning"
    assert found["detail"].startswith(str(last)) and f"Remove {last}" in found["fix"]["text"]
    text = tmaguard(pod, run.record_dir, "doctor", timeout=COMMAND_S)
    assert text.returncode == 1 and text.stderr == "" and "not a record it wrote" in text.stdout
    printed = tmaguard(pod, run.record_dir, "record", timeout=COMMAND_S)
    assert printed.returncode == 1 and printed.stdout == ""
    assert printed.stderr.startswith(f"tmaguard record: {last}") and "internal error" not in printed.stderr


def _a_nul_byte_in_a_path(document: dict) -> str:
    """A stored path no file can have (stat raises ValueError, not OSError, on it)."""
    if "entries" in document:  # verdicts.json: a file input
        document["entries"][0]["files"].insert(0, ["stat", "/nul\0byte", ["error", 2]])
    else:  # the scan cache: an extension it watches
        document["other_extensions"].append("/nul\0byte.so")
    return json.dumps(document)


def _a_field_missing(document: dict) -> str:
    """A field its reader needs taken out of a document otherwise as the guard wrote it."""
    if "entries" in document:  # verdicts.json: the stored record's problems (its line reads them)
        del document["entries"][0]["record"]["problems"]
    else:  # the scan cache: whether vLLM has platform plugins
        del document["platform_plugins"]
    return json.dumps(document)


# damage -> (what the cache file then holds, from what the guard wrote; whether it is JSON of no cache's shape
# at all, which the doctor names)
DAMAGED_CACHES = {
    "an empty list": (lambda document: "[]", True),
    "nested 100000 deep": (lambda document: "[" * 100000, True),
    "a NUL byte in a path": (_a_nul_byte_in_a_path, False),
    "a field missing": (_a_field_missing, False),
}


@pytest.mark.parametrize("damage", DAMAGED_CACHES)
def test_a_damaged_cache_is_replaced_by_the_next_process(pods, run_python, tmp_path, damage) -> None:
    """Item 10: a damaged vLLM scan cache (a JSON list, or nesting too deep to parse) made every later
    process say "internal error, leaving vLLM as it is" (vLLM then failed), and the file was never rewritten,
    so the pod never recovered; a damaged verdicts.json was never rewritten either (the cache stayed off).
    Attack: both damaged after a first process wrote them (also: JSON of the right shape naming a path with
    a NUL byte, which still crashed every full run; a stored record lacking a field its line reads, which
    failed after its libraries were loaded, so that every later process ran the full run over a mapped
    libcuda.so.1: shims and a warning instead of the overlay). The next vLLM process decides normally (vLLM
    starts with the fix) and rewrites both as valid files; the one after it replays; the doctor names each
    file that is not JSON of a cache's shape, with its fix."""
    pod = pods("vcuda", cc="9.0")
    first = run_python(pod, ACTIVATE, timeout=VLLM_START_S)
    (scan,) = first.record_dir.glob("vllm-scan-*.json")
    verdicts = first.record_dir / "verdicts.json"
    damaged, named_by_the_doctor = DAMAGED_CACHES[damage]
    written = {cache: json.loads(cache.read_text()) for cache in (scan, verdicts)}
    for cache, document in written.items():
        cache.write_text(damaged(copy.deepcopy(document)))  # the same file: this user's, 0600

    # The guard reads both caches in its activation, before vLLM's own code: vLLM's start in the first
    # case, the guard alone in the others (the overlay loaded: _starts_with_the_fix).
    starts_vllm = damage == next(iter(DAMAGED_CACHES))
    started = run_python(pod, VLLM_START if starts_vllm else ACTIVATE, timeout=VLLM_START_S)
    decided = _starts_with_the_fix(started, starts_vllm)
    assert decided_afresh(decided)
    rescanned = _json_object(scan)
    assert rescanned["version"] == decided["vllm"]["version"] and rescanned["extensions"]
    assert not any("\0" in path for path in rescanned["other_extensions"])
    assert _json_object(verdicts)["entries"][0]["record"]["pid"] == decided["pid"]
    later = run_python(pod, ACTIVATE, timeout=VLLM_START_S)
    assert own_record(later)["replayed_from"] == decided["pid"]

    for cache, document in written.items():  # damaged again: the doctor names each file it cannot read
        cache.write_text(damaged(copy.deepcopy(document)))
    report = json.loads(tmaguard(pod, first.record_dir, "doctor", "--json", timeout=COMMAND_S).stdout)
    named = {f["subject"] for f in report["findings"] if f["id"] == "cache-unusable"}
    assert named == ({str(scan), str(verdicts)} if named_by_the_doctor else set())
