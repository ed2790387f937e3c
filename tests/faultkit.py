"""What the fault-injection tests share: vLLM's start-up in fresh processes on an emulated pod, run with the
guard off, on and strict at the same time, the checks that compare them, and prefixes that make the kernel
inject real faults (a read-only bind mount, an empty /proc, file modes that bind root).

One test per fault, each in fresh processes with vLLM 0.32.0 on an emulated pod. The reference is the same
vLLM process with TMAGUARD_MODE=off, in the same pod, with the same fault: with the guard, vLLM's outcome
(the platform it resolves, or the exception it raises) is exactly that one, and the guard adds one record
line naming the fault or pointing at the record that does; with TMAGUARD_STRICT=1 start-up stops with a
message naming it. Where the guard legitimately does better than "as without" (it still supplies what the
layer lacks), the test says so.

Where the guard's answer to a fault is to load nothing, its run is the guard alone (GUARD_EFFECTS: a vLLM
start costs seconds of CPU) and shows that it changed nothing vLLM's start would meet: no driver, layer or
library of its own mapped, no variable set or removed, no import finder added. The process vLLM then starts
in is the one it starts in with the guard off (the guard's own pure-Python modules aside), so its outcome
is the reference run's, which still starts vLLM.

Faults that need the kernel's help are real, not simulated: a read-only bind mount and an empty /proc in a
private mount namespace (unshare), unreadable files for a process without CAP_DAC_OVERRIDE (setpriv, when
the tests run as root). Where the machine does not allow them, those tests fail and say what is missing."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import podkit
import pytest
from podkit import QUICK_EXIT, Pod, build_pod, guard_lines, scrubbed_environ

from vllm_tmaguard.stages import ray_env

# vLLM's start-up path: `import vllm`, then resolving the platform (which imports the CUDA extension).
RESOLVE = """
import json
out = {}
try:
    import vllm
    print("IMPORTED", flush=True)
    from vllm.platforms import current_platform
    out["platform"] = type(current_platform).__name__
except Exception as error:
    out["error"] = f"{type(error).__name__}: {error}"
print("RESULT " + json.dumps(out), flush=True)
"""
UNDEFINED = "_C_stable_libtorch.abi3.so: undefined symbol: cuTensorMapEncodeTiled"
# The guard's activation as vLLM's import hook runs it (_import_hook.py), without the rest of vLLM's start-up:
# for a run whose part is the guard's decision alone (a vLLM start costs seconds of CPU).
GUARD_ONLY = "from vllm_tmaguard.guard import activate\nactivate('import-hook')\n"
VLLM_DIR = Path(__import__("vllm_tmaguard.process").process.find_package_dir() or "")
GUARD_DIR = Path(__import__("vllm_tmaguard").__file__).parent


@dataclass(frozen=True)
class Result:
    returncode: int | None  # None: still running at the time limit (killed)
    stdout: str
    stderr: str
    record_dir: Path

    @property
    def outcome(self) -> dict | None:
        """What the child printed after 'RESULT ' (vLLM's platform or error); None if it printed nothing."""
        lines = [line for line in self.stdout.splitlines() if line.startswith("RESULT ")]
        return json.loads(lines[-1].removeprefix("RESULT ")) if lines else None

    def guard_lines(self) -> list[str]:
        return guard_lines(self.stdout)

    def line(self) -> str:
        lines = self.guard_lines()
        assert len(lines) == 1, f"expected one record line\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        return lines[0]

    def last_record(self) -> dict:
        return json.loads((self.record_dir / "last.json").read_text())


class Child:
    """A Python process inside a pod, started now, collected later (several run at once)."""

    def __init__(
        self,
        pod: Pod | None,
        code: str,
        workdir: Path,
        env: Mapping[str, str] | None = None,
        prefix: tuple[str, ...] = (),
        record_dir: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        child_env = scrubbed_environ()
        self.record_dir = record_dir or workdir / "records"
        child_env["TMAGUARD_RECORD_DIR"] = str(self.record_dir)
        child_env.update(pod.env if pod else {})
        child_env.update(env or {})
        self.out, self.err = workdir / "stdout", workdir / "stderr"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.process = subprocess.Popen(
                [*prefix, sys.executable, "-c", code + QUICK_EXIT],
                env=child_env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=cwd or workdir,
                start_new_session=True,
            )

    def collect(self, timeout: float) -> Result:
        try:
            returncode: int | None = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            returncode = None
        result = Result(returncode, self.out.read_text(), self.err.read_text(), self.record_dir)
        guard_lines(result.stdout + "\n" + result.stderr)  # every guard line of every pod run is checked
        return result


MODES = {"off": {"TMAGUARD_MODE": "off"}, "guard": {}, "strict": {"TMAGUARD_STRICT": "1"}}


def run_modes(
    pod: Pod,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    code: str = RESOLVE,
    prefix: tuple[str, ...] = (),
    timeout: float = 240,
    strict_alone: bool = False,
    guard_alone: bool = False,
    off: Result | None = None,
) -> dict[str, Result]:
    """The same process with the guard off, on and strict, run at the same time. `strict_alone`: the strict
    run is the guard alone (GUARD_ONLY), where the fault leaves strict mode nothing to stop on
    (assert_strict_goes_on says why that is enough); `guard_alone`: the guard's run is GUARD_EFFECTS, where
    the guard loads nothing for the fault (assert_as_without's `guard_alone`); `off`: the run with the guard
    off, already made (shared_reference), for a fault the guard-off process never meets."""
    codes = {"off": code, "guard": GUARD_EFFECTS if guard_alone else code}
    codes["strict"] = GUARD_ONLY if strict_alone else code
    children = {
        mode: Child(pod, codes[mode], workdir / mode, {**(env or {}), **extra}, prefix)
        for mode, extra in MODES.items()
        if not (mode == "off" and off is not None)
    }
    return {**({"off": off} if off is not None else {}), **collect_all(children, timeout)}


def shared_reference(directory: Path, kind: str, **options: Any) -> tuple[Pod, Result]:
    """A pod of `kind` (build_pod's `options`) and vLLM's start in it with the guard off (RESOLVE), made once
    into `directory` for every test process that asks (pytest-xdist's workers share it: the first makes
    both under a lock, the others read what it left). The reference for the faults that the process with
    the guard off never meets (the guard's own files, its record directory): vLLM's start there is this
    one, the same pod and the same variables. Tests run their other processes in this pod and never change
    it."""
    directory.mkdir(parents=True, exist_ok=True)
    saved = directory / "reference.json"
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not saved.exists():
            pod = build_pod(directory, kind, **options)
            run = Child(pod, RESOLVE, directory / "off", MODES["off"]).collect(240)
            real = str(pod.real_driver) if pod.real_driver else None
            made = {
                "pod": [pod.kind, str(pod.root), str(pod.lib_dir), real, pod.env],
                "run": [run.returncode, run.stdout, run.stderr, str(run.record_dir)],
            }
            saved.write_text(json.dumps(made))
    made = json.loads(saved.read_text())
    kind, root, lib_dir, real, env = made["pod"]
    returncode, stdout, stderr, record_dir = made["run"]
    pod = Pod(kind, Path(root), Path(lib_dir), Path(real) if real else None, env)
    return pod, Result(returncode, stdout, stderr, Path(record_dir))


def collect_all(children: dict[str, Child], timeout: float) -> dict[str, Result]:
    """Every child's result; `timeout` counts for all of them together (they run at the same time)."""
    deadline = time.monotonic() + timeout
    return {name: child.collect(max(0.1, deadline - time.monotonic())) for name, child in children.items()}


def assert_as_without(runs: dict[str, Result], *causes: str, guard_alone: bool = False) -> str:
    """vLLM's outcome with the guard is the one without; one record line, which names each cause or points
    at the record file that does (when the record could not be written, the line itself). Returns it.
    `guard_alone`: the guard's run was GUARD_EFFECTS, which must show that it changed nothing vLLM's start
    would meet (so vLLM's outcome is the reference's: the module docstring)."""
    off, guard = runs["off"], runs["guard"]
    assert off.guard_lines() == []
    assert off.returncode is not None, "the reference run hung"
    if guard_alone:
        assert (guard.returncode, guard.outcome) == (0, NO_EFFECTS), (guard.stdout, guard.stderr)
    else:
        assert (guard.returncode, guard.outcome) == (off.returncode, off.outcome), (
            guard.stdout,
            guard.stderr,
        )
    line = runs["guard"].line()
    assert "PROBLEM" in line, line
    file = guard.record_dir / "last.json"
    record = json.loads(file.read_text()) if file.is_file() else {}
    named = [line, *(f"{p['cause']} {p['fix']}" for p in record.get("problems", ()))]
    for cause in causes:
        assert any(cause in text for text in named), f"{cause!r} in neither the line nor its record: {line}"
    return line


# The guard alone (as vLLM's import hook runs it), then what it changed of the process that vLLM's start
# would meet: mapped files that are a driver, a layer or the guard's own libraries (or the overlay in
# memory), variables set or removed, import finders added.
GUARD_EFFECTS = """
import json, os, sys
environ, finders = dict(os.environ), list(sys.meta_path)
from vllm_tmaguard.guard import activate
activate("import-hook")
watched = ("libcuda", "nvidia", "tmaguard", "/overlay-", "memfd:")
maps = [line.split(None, 5) for line in open("/proc/self/maps").read().splitlines()]
mapped = sorted({f[5] for f in maps if len(f) == 6 and any(w in f[5] for w in watched)})
changed = {k: os.environ.get(k) for k in {*environ, *os.environ} if environ.get(k) != os.environ.get(k)}
added = [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path if f not in finders]
effects = {"mapped": mapped, "environ": changed, "finders": added}
print("RESULT " + json.dumps({"effects": effects}), flush=True)
"""
NO_EFFECTS = {"effects": {"mapped": [], "environ": {}, "finders": []}}


# What a record holds that differs between two processes of one decision.
_PER_PROCESS = ("pid", "time", "timings_ms", "elapsed_ms", "record_file")


def _decided(record: dict) -> dict:
    """`record` without what differs per process, and without what strict mode itself adds: its toggle
    carried to Ray's workers (stages/ray_env.py: two variables only Ray reads, never vLLM's own start)."""
    decided = {k: v for k, v in record.items() if k not in _PER_PROCESS}
    decided["actions"] = [
        (a["kind"], a["target"], a["applied"])
        for a in record["actions"]
        if a["target"] not in ray_env.ENV_NAMES
    ]
    routing = record["routing"]
    decided["routing"] = {
        **routing,
        "env": {k: v for k, v in routing["env"].items() if k not in ray_env.ENV_NAMES},
    }
    return decided


def assert_strict_goes_on(strict: Result, guard: Result) -> None:
    """Strict mode acts only by stopping on a problem of the issued record (stop.stop_for), besides
    carrying its toggle to Ray's workers: where the guard's run has no problem, the strict run (the guard
    alone) goes on with the same decisions, so its vLLM start is the guard run's. One vLLM start in strict
    mode with nothing to stop on shows that too: test_odd_library_path_entries's first case."""
    assert strict.returncode == 0 and "stopped start-up" not in strict.stderr, (strict.stdout, strict.stderr)
    strict.line()
    ours, theirs = strict.last_record(), guard.last_record()
    assert ours["problems"] == theirs["problems"] == []
    assert _decided(ours) == _decided(theirs)


def assert_strict_stops(run: Result, *causes: str) -> None:
    assert run.returncode == 1 and run.outcome is None, (run.stdout, run.stderr)
    assert "vllm-tmaguard (TMAGUARD_STRICT=1) stopped start-up: " in run.stderr
    for cause in causes:
        assert cause in run.stderr, f"{cause!r} not in {run.stderr}"


# ---------------------------------------------------------------------------------------------------------
# Real faults from the kernel: prefixes for the child's command line


def _fails(prefix: tuple[str, ...]) -> str:
    """Why `prefix` cannot run a command here ("" where it can)."""
    try:
        done = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    return "" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()[-600:]}"


def without_dac_override() -> tuple[str, ...]:
    """A prefix under which file modes bind this user: root loses CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH."""
    if os.geteuid() != 0:
        return ()
    prefix = (shutil.which("setpriv") or "setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")
    if why := _fails(prefix):
        pytest.fail(f"setpriv (util-linux) is needed to make file modes bind for root ({why})")
    return prefix


def private_mounts(script: str, *args: str) -> tuple[str, ...]:
    """A prefix that runs `script` (sh, with `args` as $1...) in a private mount namespace, then the
    command: `unshare -m` as root, `unshare -rm` (a user namespace) otherwise."""
    unshare = shutil.which("unshare") or "unshare"
    flags = "-m" if os.geteuid() == 0 else "-rm"
    prefix = (unshare, flags, "sh", "-c", f'{script} && shift {len(args)} && exec "$@"', "sh", *args)
    if why := _fails(prefix):
        pytest.fail(f"a private mount namespace (util-linux's unshare) is needed for this fault ({why})")
    return prefix


# A private /tmp (a tmpfs) in which the guard's default record directory, /tmp/tmaguard-<uid>, is $1: a test
# of the fall-back to it never touches the user's own. Of the real /tmp, only the entries the child needs
# are bound there (_tmp_entries_in_use): binding every entry cost seconds where /tmp held thousands, and
# raced with other processes removing theirs. The old /tmp is reached through a descriptor opened before
# the tmpfs covers it (paths not canonicalised: that would name the covered /tmp again).
def _default_record_dir_script(keep: set[str]) -> str:
    names = " ".join(shlex.quote(name) for name in sorted(keep))
    return rf"""set -e
records_at=$1 default=/tmp/tmaguard-$(id -u)
exec 3</tmp
mount -t tmpfs -o mode=1777 tmpfs /tmp
for name in {names}; do
  old=/proc/self/fd/3/$name new=/tmp/$name
  if [ "$new" = "$default" ] || ! {{ [ -e "$old" ] || [ -L "$old" ]; }}; then continue; fi
  if [ -L "$old" ]; then cp -P "$old" "$new"
  elif [ -d "$old" ]; then mkdir "$new" && mount --no-canonicalize --rbind "$old" "$new"
  else touch "$new" && mount --no-canonicalize --bind "$old" "$new"; fi
done
mkdir -m 700 "$default"
mount --bind "$records_at" "$default"
exec 3<&-"""


def _tmp_entries(paths: list[str]) -> set[str]:
    """The names of the entries of /tmp that hold `paths` (those not under /tmp hold none)."""
    parts = (Path(os.path.abspath(path)).parts for path in paths)
    return {p[2] for p in parts if len(p) > 2 and p[:2] == ("/", "tmp")}


def _tmp_entries_in_use(*paths: str) -> set[str]:
    """What a test's child needs of /tmp: `paths` (the test's own), the suite's record directory, and this
    Python, its environment and the repository, wherever they are (a clone in /tmp)."""
    ours = [sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parents[1]), tempfile.gettempdir()]
    return _tmp_entries([*paths, *ours, *filter(None, [podkit.SUITE_RECORD_DIR])])


def default_record_dir_at(scratch: Path) -> tuple[str, ...]:
    """A prefix under which the guard's default record directory is `scratch` (a directory the test made
    0700), so that what the guard writes there after refusing TMAGUARD_RECORD_DIR lands in the test's own."""
    return private_mounts(_default_record_dir_script(_tmp_entries_in_use(str(scratch))), str(scratch))


def read_only(directory: Path, default_records: Path | None = None) -> tuple[str, ...]:
    """`directory` read-only; with `default_records`, the default record directory that too (where the
    guard writes when TMAGUARD_RECORD_DIR, on the read-only file system, is refused)."""
    if default_records is None:
        return private_mounts('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"', str(directory))
    keep = _tmp_entries_in_use(str(default_records), str(directory))
    script = f'{_default_record_dir_script(keep)}\nmount --bind "$2" "$2" && mount -o remount,bind,ro "$2"'
    return private_mounts(script, str(default_records), str(directory))


def no_proc() -> tuple[str, ...]:
    return private_mounts("mount -t tmpfs none /proc")
