"""Faults of the process the guard runs in, not of its files: a working directory removed under it (item 11),
paths holding bytes that are not UTF-8 (item 12), one pid in two PID namespaces writing one record directory,
and temporary files a killed writer left behind (item 13). Real processes in emulated pods: the kernel's own
removed directory, the kernel's own PID namespaces (unshare), the real `tmaguard` commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from advkit_c import (
    ACTIVATE_AT_ONCE,
    document_of,
    guard_environ,
    read_record,
    run_guard,
    start_together,
    temporaries,
    temporary_name,
    tmaguard,
)
from faultkit import RESOLVE, Child, collect_all
from podkit import build_pod

# Runs the command in a working directory that is removed before it starts (the kernel keeps the process in
# it: getcwd() fails with ENOENT, as in a pod whose emptyDir was cleaned under a running shell).
IN_REMOVED_CWD = ("sh", "-c", 'mkdir gone && cd gone && rmdir ../gone && exec "$@"', "sh")

# The guard's activation, then what dlopen("libcuda.so.1") now answers: the fix, seen from the process.
ACTIVATE_THEN_LOAD = """
import ctypes, json, os
from vllm_tmaguard.guard import activate
try:
    os.getcwd()
    gone = False
except FileNotFoundError:
    gone = True
document = activate("removed-cwd")
handle = ctypes.CDLL("libcuda.so.1")
print("RESULT " + json.dumps({"cwd_gone": gone, "record": document is not None,
      "encode": hasattr(handle, "cuTensorMapEncodeTiled")}), flush=True)
"""


def test_removed_working_directory_gets_the_line_the_record_and_the_fix(pods, tmp_path: Path) -> None:
    """Item 11: vLLM (import, then its platform) started in a working directory that was removed. os.getcwd()
    raised outside the fail-open envelope: no line, no record, no overlay, strict mode ignored. Now the guard
    says its line, writes its record, loads the overlay on the vCUDA pod, and a strict problem still stops."""
    pod = pods("vcuda")
    children = {
        "off": Child(pod, RESOLVE, tmp_path / "off", {"TMAGUARD_MODE": "off"}, IN_REMOVED_CWD),
        "guard": Child(pod, RESOLVE, tmp_path / "guard", {}, IN_REMOVED_CWD),
        "strict": Child(
            pod, RESOLVE, tmp_path / "strict", {"TMAGUARD_STRICT": "1", "TMAGUARD_LOG_FORMAT": "xml"},
            IN_REMOVED_CWD,
        ),
        "fix": Child(pod, ACTIVATE_THEN_LOAD, tmp_path / "fix", {}, IN_REMOVED_CWD),
    }  # fmt: skip
    runs = collect_all(children, timeout=240)
    off, guard, strict, fix = runs["off"], runs["guard"], runs["strict"], runs["fix"]

    assert off.returncode is not None and off.guard_lines() == [], off.stdout
    line = guard.line()
    assert "overlay loaded" in line and "internal error" not in line, line
    record = guard.last_record()
    assert record["outcome"] == "supplied" and record["problems"] == [], record
    assert any(a["kind"] == "load-overlay" and a["applied"] for a in record["actions"]), record["actions"]
    # vLLM's own outcome in that directory is what it is without the guard (this machine's torch may fail
    # there by itself), or better: the platform resolves where only the layer's missing entry point failed.
    if off.outcome is not None and "cuTensorMapEncodeTiled" in off.outcome.get("error", ""):
        assert guard.outcome == {"platform": "CudaPlatform"}, (guard.stdout, guard.stderr)
    else:
        assert (guard.returncode, guard.outcome) == (off.returncode, off.outcome), (guard.stderr, off.stderr)

    assert fix.outcome == {"cwd_gone": True, "record": True, "encode": True}, (fix.stdout, fix.stderr)

    assert strict.returncode == 1 and strict.outcome is None, (strict.stdout, strict.stderr)
    assert "vllm-tmaguard (TMAGUARD_STRICT=1) stopped start-up: TMAGUARD_LOG_FORMAT='xml'" in strict.stderr


def test_removed_working_directory_replays_the_verdict(pods, tmp_path: Path) -> None:
    """Item 11: a second process in a removed working directory takes the verdict the first one left
    (the working directory is one of the verdict's inputs: gone, it compares as gone)."""
    pod = pods("vcuda")
    records = tmp_path / "records"
    first = run_guard(pod, records, prefix=IN_REMOVED_CWD, cwd=tmp_path)
    (tmp_path / "later").mkdir()
    second = run_guard(pod, records, prefix=IN_REMOVED_CWD, cwd=tmp_path / "later")
    documents = [document_of(done.stdout) for done in (first, second)]
    assert all(documents), [(done.stdout, done.stderr) for done in (first, second)]
    assert [d["outcome"] for d in documents] == ["supplied"] * 2
    assert documents[0]["replayed_from"] is None
    assert documents[1]["replayed_from"] == documents[0]["pid"], documents[1]
    assert all(read_record(Path(d["record_file"]))["pid"] == d["pid"] for d in documents)


def test_removed_working_directory_the_commands_answer(pods, tmp_path: Path) -> None:
    """Item 11: `tmaguard doctor`, `check` and `env` run in a working directory that was removed (a shell
    left in a cleaned directory): the doctor said "internal error: FileNotFoundError", `check` and `env`
    died with a traceback. Now each answers as it does elsewhere."""
    pod = pods("vcuda")
    env = guard_environ(pod, tmp_path / "records")
    for args in (("doctor", "--json"), ("check", "--json"), ("env",)):
        done = subprocess.run(
            [*IN_REMOVED_CWD, sys.executable, "-m", "vllm_tmaguard", *args],
            env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0 and done.stderr == "", (args, done.returncode, done.stderr)
        if args[0] == "doctor":
            assert json.loads(done.stdout)["status"] == "healthy"
        elif args[0] == "check":
            assert json.loads(done.stdout)["outcome"] == "supplied"  # the pod's own mode's verdict (issue 34)
        else:
            assert f"{pod.lib_dir}/libcuda.so.1 lacks cuTensorMapEncodeTiled" in done.stdout, done.stdout


def test_undecodable_path_bytes_are_printed_escaped(standins, tmp_path: Path) -> None:
    """Item 12: a pod whose driver directory and record directory are named with the byte 0xff (not UTF-8),
    read with PYTHONIOENCODING=utf-8: the line was "--- Logging error ---" and a traceback; `tmaguard doctor`
    and `tmaguard env` died with UnicodeEncodeError. Now each prints, the byte escaped as \\xff."""
    base = Path(os.fsdecode(bytes(tmp_path) + b"/pods\xff"))
    pod = build_pod(base, "vcuda")
    records = Path(os.fsdecode(bytes(tmp_path) + b"/records\xff"))
    utf8 = {"PYTHONIOENCODING": "utf-8"}

    done = run_guard(pod, records, utf8, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "Logging error" not in output and "Traceback" not in output, output
    (line,) = [text for text in done.stdout.splitlines() if text.startswith("(tmaguard pid=")]
    assert "overlay loaded" in line and "records\\xff/process-" in line, line

    env = guard_environ(pod, records, utf8)
    for args in (("doctor",), ("doctor", "--json"), ("env",), ("check", "--json"), ("record",)):
        done = tmaguard(*args, env=env, cwd=tmp_path)
        output = done.stdout + done.stderr
        assert done.returncode in (0, 1), (args, done.returncode, output)
        assert "Error" not in done.stderr and "Traceback" not in output, (args, output)
        assert done.stdout.strip(), args
        if "--json" in args or args == ("record",):
            assert "records\\udcff" in done.stdout or "pods\\udcff" in done.stdout, args  # JSON's escape
            json.loads(done.stdout)
        else:
            assert "pods\\xff" in done.stdout or "records\\xff" in done.stdout, (args, done.stdout)
    installed = Path(os.fsdecode(bytes(tmp_path) + b"/overlay\xff"))
    done = tmaguard("env", "--install-dir", str(installed), env=env, cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert f"# installed {tmp_path}/overlay\\xff/libcuda.so.1" in done.stdout, done.stdout
    assert (installed / "libcuda.so.1").is_file()


def test_same_pid_in_two_pid_namespaces_keeps_every_record(pods, tmp_path: Path) -> None:
    """Item 13: vLLM containers of one pod in PID namespaces of their own, sharing one record directory: each
    first process is pid 1. Temporary file names were the pid and a counter, so two writers took the same
    name and one of them lost its record (4 of 80 runs). Now: 16 processes at a time, each pid 1 in a new PID
    namespace, released together onto an empty record directory, five times: every one wrote its record,
    and what is left there is a valid record, with no temporary file."""
    pod = pods("vcuda")
    namespace = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", ACTIVATE_AT_ONCE]
    assert subprocess.run([*namespace[:4], "true"], capture_output=True, timeout=120).returncode == 0, (
        "unshare --pid"
    )
    for round_ in range(5):
        records = tmp_path / f"records-{round_}"
        outputs = start_together(namespace, 16, guard_environ(pod, records), tmp_path / f"round-{round_}")
        documents = [document_of(stdout) for _, stdout in outputs]
        assert all(d is not None and d["pid"] == 1 for d in documents), outputs
        lost = [d["problems"] for d in documents if not d["record_file"] or d["problems"]]
        assert lost == [], f"round {round_}: {len(lost)} of 16 processes lost their record: {lost[0]}"
        triggers = {d["trigger"] for d in documents}
        # One name for all of them: the record there is one of theirs, whole; last.json too (maybe another's).
        assert read_record(records / "process-1.json")["trigger"] in triggers
        assert read_record(records / "last.json")["trigger"] in triggers
        assert temporaries(records) == []


def test_stale_temporary_files_are_removed_and_fresh_ones_kept(pods, tmp_path: Path) -> None:
    """Item 13: temporary files a killed writer left in the record directory (and in the overlay's directory
    in it) were never removed. Now the next process removes those older than files.STALE_TEMPORARY_S, and
    keeps a fresh one: another process's write under way."""
    pod = pods("vcuda")
    records = tmp_path / "records"
    assert run_guard(pod, records).returncode == 0
    (overlay_dir,) = records.glob("overlay-*")
    hour_ago = time.time() - 3600
    stale = [
        records / temporary_name("last.json", 4242, "0123456789abcdef"),
        records / temporary_name("process-77.json", 77, "00112233aabbccdd"),
        records / temporary_name("verdicts.json", 1, "ffffffffffffffff"),  # pid 1 of another namespace
        overlay_dir / temporary_name("libcuda.so.1", 4242, "0a0a0a0a0a0a0a0a"),
    ]
    fresh = [
        records / temporary_name("last.json", 4343, "fedcba9876543210"),
        overlay_dir / temporary_name("libcuda.so.1", 4343, "1b1b1b1b1b1b1b1b"),
    ]
    for path in stale + fresh:
        path.write_bytes(b"{half a rec")
        path.chmod(0o600)
    for path in stale:
        os.utime(path, (hour_ago, hour_ago))

    # The next process (a replay: it writes its record alone) sweeps the record directory and the overlay's.
    replayed = document_of(run_guard(pod, records).stdout)
    assert replayed is not None and replayed["replayed_from"] is not None, replayed
    assert temporaries(records) == sorted(fresh)

    from vllm_tmaguard.files import STALE_TEMPORARY_S

    assert 10 <= STALE_TEMPORARY_S < 3600  # longer than any write takes; shorter than a pod's life
    almost = time.time() - STALE_TEMPORARY_S + 30
    os.utime(fresh[0], (almost, almost))
    assert run_guard(pod, records).returncode == 0
    assert fresh[0].exists()
