"""Everything the full run reads is among the inputs its stored verdict is checked against (inputs.py): a
process whose environment or files differ in anything the stages looked at must not replay the verdict.
The full run runs in a real process on an emulated pod with every environment read and every file access
recorded (an audit hook for open/listdir/scandir, os.stat and os.lstat wrapped), then the test compares.

Not inputs, by design (docs/design.md §4.1): the guard's own files in its directory (the caches, records),
Python's imports and sys.path (where vLLM would be imported from is a process input of its own),
/proc/self (so are the mapped files), and the vLLM tree's
files other than its extensions and _version.py (the vLLM scan cache rests on those alone, and the verdict
cache on the scan); the environment as redaction and the log handler read it (they act live in a replay)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_tmaguard.files import default_record_dir

RECORDING_RUN = r"""
import json, os, sys
import ctypes, difflib  # what the stages import lazily, imported before the recording starts
import vllm_tmaguard.stages.pipeline
from vllm_tmaguard.guard import activate

touched = []
env_reads = []

def audit(event, args):
    if event == "open" and isinstance(args[0], (str, bytes)):
        touched.append(["open", os.fsdecode(args[0])])
    elif event in ("os.listdir", "os.scandir") and isinstance(args[0], (str, bytes)):
        touched.append(["list", os.fsdecode(args[0])])

def wrap(name):
    real = getattr(os, name)
    def recorded(path, *args, **kwargs):
        if isinstance(path, (str, bytes)):
            touched.append([name, os.fsdecode(path)])
        return real(path, *args, **kwargs)
    setattr(os, name, recorded)

class Environ(dict):
    def _note(self, key):
        env_reads.append([key, sys._getframe(2).f_globals.get("__name__")])
    def __getitem__(self, key):
        self._note(key)
        return dict.__getitem__(self, key)
    def get(self, key, default=None):
        self._note(key)
        return dict.get(self, key, default)
    def __contains__(self, key):
        self._note(key)
        return dict.__contains__(self, key)
    def items(self):
        self._note("*")
        return dict.items(self)
    def values(self):
        self._note("*")
        return dict.values(self)

real_environ = os.environ
os.environ = Environ(real_environ)
wrap("stat"); wrap("lstat")
sys.addaudithook(audit)
activate("test")
sys_path = [os.path.abspath(entry) for entry in sys.path]  # '' (python -c): the working directory
print("RESULT " + json.dumps({"touched": touched, "env": env_reads, "sys_path": sys_path}))
"""

# Modules whose reads of the environment are not decisions: they act live in a replay too.
LIVE_READERS = {"vllm_tmaguard.redaction", "vllm_tmaguard.issue"}
# The whole environment, read to keep which variables show in the record (verdict.shown_variables): what a
# replay asks again of its own environment, not an input of the verdict.
SHOWN_READS = {("*", "vllm_tmaguard.verdict")}
GUARD_FILES = ("vllm-scan-", "verdicts.json", "process-", "last.json", ".", "overlay-", "libcuda.so.1")


def exempt(path: str, records: Path, vllm_dir: Path, sys_path: list[str]) -> bool:
    """Not an input by design (this module's docstring)."""
    name = Path(path).name
    in_vllm = Path(path).is_relative_to(vllm_dir) or Path(path).is_relative_to(vllm_dir.parent)
    vllm_metadata = in_vllm and not name.endswith(".so") and name != "_version.py"
    return (
        (Path(path).is_relative_to(records) and name.startswith(GUARD_FILES))
        # opened from the private directory's descriptor (files.py): a name, not a path
        or (not Path(path).is_absolute() and name.startswith(GUARD_FILES))
        or Path(path) == records  # listed to keep its newest records
        or path == default_record_dir()  # where the replay looks before the full run (verdict.py)
        or path.startswith("/proc/self/")
        or path in sys_path
        or (name.endswith((".py", ".pyc")) and not (in_vllm and name == "_version.py"))
        or vllm_metadata
    )


@pytest.mark.parametrize(
    ("kind", "env"),
    [
        ("bare", {}), ("vcuda", {}), ("vcuda", {"TMAGUARD_OVERLAY": "off"}), ("vcuda-fork", {}),
        ("vcuda-v105", {}), ("hami", {}), ("lupine", {}), ("nogpu", {}),
    ],
    ids=["bare", "vcuda", "vcuda-shims", "vcuda-fork", "vcuda-v105", "hami", "lupine", "nogpu"],
)  # fmt: skip
def test_every_input_of_the_full_run_is_watched(pods, run_python, kind, env) -> None:
    from vllm_tmaguard.process import find_package_dir

    pod = pods(kind, cc="9.0") if kind != "nogpu" else pods(kind)
    run = run_python(pod, RECORDING_RUN, env)
    (entry,) = json.loads((run.record_dir / "verdicts.json").read_text())["entries"]
    process, observed = entry["process"], {(kind, path) for kind, path, _ in entry["files"]}
    watched_paths = {path for _, path in observed}

    # LD_LIBRARY_PATH may be observed by its effect on the loader's search (verdict.library_path_view;
    # tests/test_verdict_cache.py changes it both ways).
    names, prefixes = {*process["env_names"], "LD_LIBRARY_PATH"}, tuple(process["env_prefixes"])
    assert "library_path" in process
    decision_reads = {
        key
        for key, module in run.result["env"]
        if module not in LIVE_READERS and (key, module) not in SHOWN_READS
    }
    assert "*" not in decision_reads, "a stage reads the whole environment"
    assert {key for key in decision_reads if key not in names and not key.startswith(prefixes)} == set()

    vllm_dir, sys_path = Path(find_package_dir("vllm")), run.result["sys_path"]
    inputs = [
        (op, path)
        for op, path in run.result["touched"]
        if not exempt(path, run.record_dir.resolve(), vllm_dir, sys_path)
    ]
    missing = sorted({(op, path) for op, path in inputs if path not in watched_paths})
    assert missing == [], "\n".join(map(str, missing))
    if kind != "nogpu":  # the CUDA torch was built for (runtime_cuda.py): a .py, which the above exempts
        assert str(Path(find_package_dir("torch")) / "version.py") in watched_paths
    listed = {path for op, path in inputs if op == "list"}
    assert {p for p in listed if ("list", p) not in observed and ("stat", p) not in observed} == set()
