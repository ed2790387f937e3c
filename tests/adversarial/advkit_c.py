"""What helper C's adversarial tests share (process faults, exit statuses, stress): the guard's activation in
a fresh process of an emulated pod, `tmaguard` as a command, and checks of what lies in a record directory
afterwards, written from the record's documented shape, not from the package's own reader of it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from podkit import Pod, child_environ, guard_lines

# The guard's activation alone (what the platform plugin and the import hook call), then its record as the
# process holds it, on one line after "DOC ".
ACTIVATE = """
import json, os, sys
from vllm_tmaguard.guard import activate
document = activate(sys.argv[1] if len(sys.argv) > 1 else "adversarial")
print("DOC " + json.dumps(document), flush=True)
"""

# Waits for the test's "go" (every child started and ready: their writes then overlap), then activates.
ACTIVATE_AT_ONCE = """
import json, os, sys, time
from vllm_tmaguard.guard import activate
go, ready, trigger = sys.argv[1:4]
open(ready, "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.001)
document = activate(trigger)
print("DOC " + json.dumps(document), flush=True)
"""


def start_together(
    command: list[str], count: int, env: dict[str, str], scratch: Path, ready_within_s: float = 60
) -> list[tuple[int, str]]:
    """`count` processes of `command` + [go, ready, trigger] (ACTIVATE_AT_ONCE), released together once all
    are ready (a process not ready in `ready_within_s` fails the test: released late, it would race nobody);
    (pid, stdout) of each, its guard lines checked."""
    scratch.mkdir()
    go = scratch / "go"
    children = []
    for index in range(count):
        ready = scratch / f"ready-{index}"
        args = [str(go), str(ready), f"{scratch.name}-{index}"]
        child = subprocess.Popen(
            [*command, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        children.append((ready, child))
    deadline = time.monotonic() + ready_within_s
    while not all(ready.exists() for ready, _ in children) and time.monotonic() < deadline:
        time.sleep(0.005)
    late = [index for index, (ready, _) in enumerate(children) if not ready.exists()]
    if late:  # released anyway, they would start one after another: no race tested
        for _, child in children:
            child.kill()
            child.communicate()
        late_s = f"{len(late)} of {count} processes were not ready in {ready_within_s} s"
        raise AssertionError(f"{late_s}: {late[:8]}")
    go.touch()
    outputs = []
    for _, child in children:
        stdout, stderr = child.communicate(timeout=60)
        assert child.returncode == 0, stderr
        guard_lines(stdout + "\n" + stderr)
        outputs.append((child.pid, stdout))
    return outputs


# A temporary file as files.temporary_name names them: ".NAME.<pid>-<16 hex digits>.tmp".
TEMPORARY_SUFFIX = ".tmp"


def temporary_name(name: str, pid: int, salt: str) -> str:
    return f".{name}.{pid}-{salt:0>16}{TEMPORARY_SUFFIX}"


def temporaries(directory: Path) -> list[Path]:
    """Every hidden file under `directory` (its subdirectories too: the overlay's): the guard names nothing
    it keeps with a leading dot, so each is a writer's temporary file, whatever its form."""
    return sorted(directory.rglob(".*"))


def document_of(stdout: str) -> dict[str, Any] | None:
    """The record the child's activation returned (ACTIVATE), or None if it printed none."""
    lines = [line for line in stdout.splitlines() if line.startswith("DOC ")]
    return json.loads(lines[-1].removeprefix("DOC ")) if lines else None


def guard_environ(pod: Pod, record_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return child_environ(pod, record_dir, extra)


def run_guard(
    pod: Pod,
    record_dir: Path,
    extra: Mapping[str, str] | None = None,
    *,
    code: str = ACTIVATE,
    args: Sequence[str] = (),
    prefix: Sequence[str] = (),
    cwd: Path | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """One fresh Python process inside `pod` running `code` (the activation), its guard lines checked."""
    done = subprocess.run(
        [*prefix, sys.executable, "-c", code, *args],
        env=guard_environ(pod, record_dir, extra),
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=timeout,
        cwd=cwd or record_dir.parent,
    )
    guard_lines(done.stdout + "\n" + done.stderr)
    return done


def tmaguard(
    *args: str, env: Mapping[str, str], cwd: Path, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`tmaguard ARGS` (python -m vllm_tmaguard, as the stock-image preflight runs it)."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_tmaguard", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=timeout,
        cwd=cwd,
    )


# The record's fields that its readers use (`tmaguard doctor`, `tmaguard record`, the metrics), with their
# JSON types: schema 2 as record.Record.to_json writes it. Written here from the documented shape, so that a
# record the package's own reader would wave through is still checked.
_TEXT, _INT, _LIST, _DICT, _NULL = str, int, list, dict, type(None)
RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (_INT,), "tmaguard": (_TEXT,), "pid": (_INT,), "time": (_TEXT,), "trigger": (_TEXT,),
    "mode": (_TEXT,), "outcome": (_TEXT,), "summary": (_TEXT,), "layers": (_LIST,), "libcuda": (_DICT,),
    "gpu": (_DICT,), "vllm": (_DICT,), "lacking": (_LIST,), "missing": (_DICT,), "supplied": (_DICT,),
    "encoder": (_DICT, _NULL), "tma": (_DICT, _NULL), "routing": (_DICT, _NULL), "actions": (_LIST,),
    "problems": (_LIST,), "elapsed_ms": (int, float), "record_file": (_TEXT, _NULL),
    "forked_from": (_INT, _NULL), "replayed_from": (_INT, _NULL),
}  # fmt: skip
_PROBLEM_FIELDS = ("code", "cause", "consequence", "fix")


def record_problem(document: Any) -> str | None:
    """Why `document` is not a schema-2 record (None: it is one)."""
    if not isinstance(document, dict):
        return f"a {type(document).__name__}, not a JSON object"
    if document.get("schema") != 2:
        return f"schema {document.get('schema')!r}, not 2"
    for name, types in RECORD_FIELDS.items():
        value = document.get(name, KeyError)
        if value is KeyError:
            return f"no field {name!r}"
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"field {name!r} is {value!r}"
    for problem in document["problems"]:
        if not isinstance(problem, dict) or not all(isinstance(problem.get(f), str) for f in _PROBLEM_FIELDS):
            return f"a problem of the wrong shape: {problem!r}"
    for action in document["actions"]:
        if not isinstance(action, dict) or not isinstance(action.get("kind"), str):
            return f"an action of the wrong shape: {action!r}"
    return None


def read_record(path: Path) -> dict[str, Any]:
    """The record file at `path`, asserted to be valid JSON of the record's shape."""
    try:
        document = json.loads(path.read_bytes())
    except ValueError as error:
        raise AssertionError(f"{path} is not JSON: {error}") from None
    problem = record_problem(document)
    assert problem is None, f"{path} is not a record: {problem}"
    return document


def assert_directory_sound(directory: Path) -> dict[str, dict[str, Any]]:
    """Every record file in `directory` (process-*.json, last.json) valid, last.json the same as one of the
    process records, every other JSON file the guard keeps there (its caches) valid JSON. Returns the
    process records by name."""
    records = {p.name: read_record(p) for p in directory.glob("process-*.json")}
    for name, record in records.items():
        assert name == f"process-{record['pid']}.json", (name, record["pid"])
    last = read_record(directory / "last.json")
    assert f"process-{last['pid']}.json" in records, f"last.json is pid {last['pid']}'s, whose record is gone"
    for cache in [directory / "verdicts.json", *directory.glob("vllm-scan-*.json")]:
        if cache.exists():
            try:
                json.loads(cache.read_bytes())
            except ValueError as error:
                raise AssertionError(f"{cache} is not JSON: {error}") from None
    return records


def overlay_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("overlay-*/libcuda.so.1"))
