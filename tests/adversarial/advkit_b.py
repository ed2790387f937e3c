"""Helper B's kit for the adversarial tests of the verdict cache and of damaged files (issue 25, items 4 and
6-10): which process of a run is the test's own, what it mapped, a file changed in place the way `touch -r`
hides it, a verdict cache whose stored inputs are made to match the file system again, and the `tmaguard`
command run inside a pod with a bound on time and memory."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from podkit import Pod, Run, child_environ

# Says which process is the one the test started: vLLM starts helpers on sm_90 whose guards write records too.
SAYS_PID = "import os\nprint('PID', os.getpid(), flush=True)\n"
# Appended to a child's code: every mapped file whose path names the guard's libraries or libcuda, with the
# inode mapped (a file replaced at the same path is another inode).
PRINT_MAPS = """
import json as _json
_maps = {}
for _line in open("/proc/self/maps"):
    _fields = _line.split(None, 5)
    if len(_fields) == 6 and ("tmaguard" in _fields[5] or "libcuda" in _fields[5]):
        _maps[_fields[5].strip()] = int(_fields[4])
print("MAPS " + _json.dumps(_maps), flush=True)
"""
# The guard alone (no vLLM import: a second or two), then what the process mapped.
ACTIVATE = SAYS_PID + "from vllm_tmaguard.guard import activate\nactivate('test')\n" + PRINT_MAPS
# Bounds what a child may allocate: a reader that slurps /dev/zero fails with MemoryError, not the machine.
CHILD_MEMORY = 4 << 30


def own_pid(run: Run) -> int:
    (pid,) = (int(line.split()[1]) for line in run.stdout.splitlines() if line.startswith("PID "))
    return pid


def own_record(run: Run) -> dict:
    """The record of the process the test started."""
    return run.record_of(own_pid(run))


def maps(run: Run) -> dict[str, int]:
    """What the child printed after PRINT_MAPS: mapped path -> inode."""
    (line,) = (line for line in run.stdout.splitlines() if line.startswith("MAPS "))
    return json.loads(line.removeprefix("MAPS "))


def decided_afresh(record: dict) -> bool:
    return record.get("replayed_from") is None and "replay" not in record["timings_ms"]


def cache_entries(records: Path) -> list[dict]:
    return json.loads((records / "verdicts.json").read_text())["entries"]


def padded(data: bytes, size: int) -> bytes:
    """An ELF file with zeros after its last byte (nothing reads past the section headers)."""
    assert len(data) <= size
    return data + bytes(size - len(data))


def rewrite_in_place(path: Path, data: bytes) -> None:
    """The attack of item 6: new content written into the same inode, same size, its modification time put
    back (`touch -r`): everything but the change time is as before."""
    before = os.stat(path)
    assert len(data) == before.st_size, (len(data), before.st_size)
    with open(path, "r+b") as file:
        file.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    kept = ("st_ino", "st_dev", "st_mode", "st_size", "st_mtime_ns", "st_uid", "st_gid")
    assert [getattr(after, f) for f in kept] == [getattr(before, f) for f in kept]


# How the verdict cache lays out a file's observation (verdict.py at 1cc570e; files.observation now: the
# change time added), by the kind of observation.
_LAYOUTS = {
    "stat": (
        ("st_mode", "st_ino", "st_dev", "st_size", "st_mtime_ns", "st_ctime_ns", "st_uid", "st_gid"),
        ("st_mode", "st_ino", "st_dev", "st_size", "st_mtime_ns", "st_uid", "st_gid"),
    ),
    "owner": (("st_mode", "st_ino", "st_dev", "st_uid", "st_gid"),),
}


def restamp(records: Path, path: Path, before: os.stat_result) -> int:
    """Rewrites every stored observation of `path` (not a link) in the verdict cache that was taken as
    `before` into the observation of the same kind taken now. The stored inputs then match the file system
    again, so only a check the replay makes beyond them can tell. Returns how many it rewrote; an
    observation of `path` this kit cannot lay out fails the test."""
    after = os.lstat(path)
    cache = records / "verdicts.json"
    document = json.loads(cache.read_text())
    count = 0
    for entry in document["entries"]:
        for stored in entry["files"]:
            kind, where, seen = stored
            if where != str(path):
                continue
            (layout,) = [
                fields for fields in _LAYOUTS.get(kind, ()) if seen == [getattr(before, f) for f in fields]
            ] or [None]
            assert layout is not None, f"an observation of {path} this kit cannot lay out: {stored}"
            stored[2] = [getattr(after, f) for f in layout]
            count += 1
    cache.write_text(json.dumps(document))  # the same file: its owner and mode (0600) stay
    return count


def _bounded_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def tmaguard(
    pod: Pod, records: Path, *args: str, timeout: float = 20, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m vllm_tmaguard ARGS` inside `pod` with its records in `records`; a hang is
    subprocess.TimeoutExpired after `timeout` seconds, a runaway read a MemoryError past CHILD_MEMORY."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_tmaguard", *args],
        env=child_environ(pod, records, env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=records.parent,
        preexec_fn=_bounded_memory,
    )
