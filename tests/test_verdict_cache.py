"""The verdict cache (vllm_tmaguard/verdict.py, docs/design.md §4.1) with vLLM 0.32.0's real extensions on
emulated pods: a later process of the same pod replays the first one's verdict (the same record, the same
changes made: vLLM starts the same way), and any changed input (a toggle, a file, the GPUs, a library
already mapped, a secret, a module already imported) sends it to the full run, which decides afresh."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from faultkit import GUARD_EFFECTS, NO_EFFECTS
from podkit import DEFAULT_DRIVER, build_pod, write_gpus
from test_guard_vllm import DRIVER_CALLS, RESOLVE_PLATFORM

# What differs between two processes' records of one verdict.
PER_PROCESS = ("pid", "time", "trigger", "timings_ms", "elapsed_ms", "record_file", "replayed_from")
# Says which process is the one the test started: vLLM starts helpers on sm_90 (Humming's build) whose
# guards write records too.
SAYS_PID = "import os\nprint('PID', os.getpid(), flush=True)\n"
# The guard's activation as vLLM's import hook runs it, without the rest of vLLM's start-up: for the processes
# whose part in a test is the verdict alone (stored, replayed or decided afresh: all done in the activation,
# before vLLM's own code runs; a vLLM start costs seconds of CPU). Where a test is about how vLLM then
# starts, a process starts vLLM (test_a_later_process_replays_the_first_ones_verdict: a replay starts vLLM
# as the full run did).
GUARD_ONLY = "from vllm_tmaguard.guard import activate\nactivate('import-hook')\n"


def record(run) -> dict:
    """The record of the process the test started."""
    (pid,) = (int(line.split()[1]) for line in run.stdout.splitlines() if line.startswith("PID "))
    return run.record_of(pid)


def decisions(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in PER_PROCESS}


def entries(records: Path) -> list[dict]:
    path = records / "verdicts.json"
    return json.loads(path.read_text())["entries"] if path.exists() else []


def driver_calls_env(pod, standins) -> dict[str, str]:
    return {"DRIVER_CALLS_DIR": str(standins["driver_calls_ext"].parent), "REAL_DRIVER": str(pod.real_driver)}


@pytest.mark.parametrize(
    ("kind", "env"),
    [("vcuda", {}), ("vcuda", {"TMAGUARD_OVERLAY": "off"}), ("bare", {}), ("hami", {})],
    ids=["vcuda-overlay", "vcuda-shims", "bare", "hami"],
)
def test_a_later_process_replays_the_first_ones_verdict(pods, run_python, standins, kind, env) -> None:
    pod = pods(kind, cc="9.0")
    code = SAYS_PID + (DRIVER_CALLS if kind == "vcuda" else RESOLVE_PLATFORM)
    env = {**env, **driver_calls_env(pod, standins)} if kind == "vcuda" else env
    first = run_python(pod, code, env)
    later = run_python(pod, code, env)
    decided, replayed = record(first), record(later)
    assert "replayed_from" not in decided or decided["replayed_from"] is None
    assert replayed["replayed_from"] == decided["pid"] and list(replayed["timings_ms"]) == ["replay"]
    assert decisions(replayed) == decisions(decided)
    assert later.result == first.result  # vLLM started the same way: platform, ops, where each call landed
    assert "error" not in later.result, later.result
    assert message(later, replayed) == message(first, decided)


def message(run, record: dict) -> str:
    """The guard's one line in `run`'s output, without vLLM's prefix and the process's own record file."""
    (line,) = run.guard_lines()
    return line.split("] ", 1)[1].replace(record["record_file"], "<record file>")


def _touch_driver(pod) -> dict[str, str]:
    (pod.lib_dir / "libcuda.so.1").unlink()
    shutil.copy(pod.real_driver, pod.lib_dir / "libcuda.so.1")  # the layer replaced by the real driver
    return {}


def _other_gpu(pod) -> dict[str, str]:
    shutil.rmtree(pod.root / "proc")
    write_gpus(pod.root, "NVIDIA GeForce RTX 4090", DEFAULT_DRIVER, 1)
    return {}


def _preload(pod) -> dict[str, str]:
    vgpu = pod.root / "usr/local/vgpu/libvgpu.so"
    vgpu.parent.mkdir(parents=True)
    vgpu.write_bytes(b"")
    (pod.root / "etc").mkdir(exist_ok=True)
    (pod.root / "etc/ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    return {}


# change -> (how to make it, the record's field it changes (None: only the inputs), verdicts kept: one per
# process observation (LD_LIBRARY_PATH's libcuda.so.1 files are part of it), a changed file's verdict
# replaces its own)
CHANGES = {
    "a toggle": (lambda pod: {"TMAGUARD_GEMM": "portable"}, "routing", 2),
    "a knob routing merges with": (lambda pod: {"VLLM_DISABLED_KERNELS": "HummingLinearKernel"}, None, 2),
    "libcuda.so.1 replaced": (_touch_driver, "outcome", 2),
    "another GPU": (_other_gpu, "gpu", 1),
    "a preload appears": (_preload, "layers", 1),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_input_sends_the_process_to_the_full_run(pods, run_python, change) -> None:
    pod = pods("vcuda", cc="9.0")
    first = run_python(pod, SAYS_PID + GUARD_ONLY)
    make_change, field, kept = CHANGES[change]
    env = make_change(pod)
    later = run_python(pod, SAYS_PID + GUARD_ONLY, env)
    decided, again = record(first), record(later)
    assert again.get("replayed_from") is None and "replay" not in again["timings_ms"]
    assert field is None or again[field] != decided[field]  # decided afresh, on what changed
    assert len(entries(later.record_dir)) == kept
    assert record(run_python(pod, SAYS_PID + GUARD_ONLY, env))["replayed_from"] == again["pid"]


@pytest.mark.parametrize("kind", ["vcuda", "bare"])
def test_a_library_path_entry_without_the_driver_is_no_change(pods, run_python, tmp_path, kind) -> None:
    """vLLM's API server imports opencv, which adds its own directory to LD_LIBRARY_PATH (with a trailing
    ':' where it was empty: the working directory) for the processes it starts, the EngineCore first. Where
    those entries hold no libcuda.so.1 the loader finds what it found, and the verdict is replayed; an entry
    that holds one is a changed input."""
    pod = pods(kind, cc="9.0")
    first = run_python(pod, SAYS_PID + GUARD_ONLY)
    inherited = pod.env.get("LD_LIBRARY_PATH", "")
    opencv = {"LD_LIBRARY_PATH": f"{tmp_path / 'cv2/../../lib64'}:{inherited}"}
    later = run_python(pod, SAYS_PID + GUARD_ONLY, opencv)
    assert record(later)["replayed_from"] == record(first)["pid"]
    shadowing = tmp_path / "shadow"
    shadowing.mkdir()
    shutil.copy(pod.lib_dir / "libcuda.so.1", shadowing / "libcuda.so.1")
    shadowed = run_python(pod, SAYS_PID + GUARD_ONLY, {"LD_LIBRARY_PATH": f"{shadowing}:{inherited}"})
    own = record(shadowed)
    assert own.get("replayed_from") is None and own["libcuda"]["path"] == str(shadowing / "libcuda.so.1")


def test_a_library_mapped_before_the_guard_is_a_changed_input(pods, run_python) -> None:
    pod = pods("vcuda", cc="9.0")
    first = run_python(pod, SAYS_PID + GUARD_ONLY)
    mapped_first = "import ctypes, os; ctypes.CDLL('libcuda.so.1', mode=os.RTLD_GLOBAL)\n" + GUARD_ONLY
    later = run_python(pod, SAYS_PID + mapped_first)
    own = record(later)
    assert own.get("replayed_from") is None and own["libcuda"]["how"] == "mapped"
    assert own["actions"] != record(first)["actions"]  # decided afresh: the overlay can no longer be loaded


def test_a_secret_that_would_show_in_the_stored_record_is_no_replay(pods, run_python) -> None:
    """The stored record was redacted against the first process's environment; a later one with a secret
    whose value appears in it gets the full run, which redacts it."""
    pod = pods("vcuda", cc="9.0")
    first = run_python(pod, SAYS_PID + GUARD_ONLY)
    assert str(pod.lib_dir) in json.dumps(record(first))
    later = run_python(pod, SAYS_PID + GUARD_ONLY, {"SERVICE_API_KEY": str(pod.lib_dir)})
    own = record(later)
    assert own.get("replayed_from") is None
    assert str(pod.lib_dir) not in json.dumps(own) and "<redacted $SERVICE_API_KEY>" in json.dumps(own)
    harmless = run_python(pod, SAYS_PID + GUARD_ONLY, {"SOME_SETTING": str(pod.lib_dir)})
    assert record(harmless)["replayed_from"] == record(first)["pid"]  # the redacted one was not stored


def strings(value) -> list[str]:
    """Every string in a JSON-like value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in [key, *strings(item)]]
    if isinstance(value, list):
        return [text for item in value for text in strings(item)]
    return []


@pytest.mark.parametrize(
    "secret", ["p\u00e4ssw\u00f6rd", 'pass"wo\\rd'], ids=["non-ascii", "quote-backslash"]
)
def test_a_secret_escaped_in_the_stored_record_is_no_replay(standins, run_python, tmp_path, secret) -> None:
    """Issue 34: the stored record is JSON whose text escapes a non-ASCII character, a quote or a backslash;
    a later process whose secret holds one (the pod's path here) must still find it there: it gets the full
    run, which redacts it, and its record never holds the secret."""
    pod = build_pod(tmp_path / secret, "vcuda", cc="9.0")
    first = run_python(pod, SAYS_PID + GUARD_ONLY)
    assert record(first)["libcuda"]["path"] == str(pod.lib_dir / "libcuda.so.1")
    later = run_python(pod, SAYS_PID + GUARD_ONLY, {"SERVICE_API_KEY": str(pod.lib_dir)})
    own = record(later)
    assert own.get("replayed_from") is None
    assert not [text for text in strings(own) if str(pod.lib_dir) in text]
    assert own["libcuda"]["path"] == "<redacted $SERVICE_API_KEY>/libcuda.so.1"


def test_a_module_to_block_already_imported_is_no_replay(pods, run_python) -> None:
    """A network layer on Hopper: no real encoder, so FA3's extension is kept from importing. A later
    process that imported it already gets the full run, which says so."""
    pod = pods("lupine", cc="9.0")
    first = run_python(pod, SAYS_PID + GUARD_ONLY)
    blocked = record(first)["routing"]["blocked_imports"]
    assert "vllm.vllm_flash_attn._vllm_fa3_C" in blocked
    imported = f"import sys, types\nsys.modules[{blocked[0]!r}] = types.ModuleType('fa3')\n"
    later = run_python(pod, SAYS_PID + imported + GUARD_ONLY)
    own = record(later)
    assert own.get("replayed_from") is None
    assert [p["code"] for p in own["problems"]] == ["imported-early"]
    assert len(entries(later.record_dir)) == 1  # a problem of that process alone is not stored for others
    assert record(run_python(pod, SAYS_PID + GUARD_ONLY))["replayed_from"] == record(first)["pid"]


def test_a_strict_stop_is_never_stored(pods, run_python) -> None:
    pod = pods("vcuda", cc="9.0")
    env = {"TMAGUARD_LOG_FORMAT": "xml", "TMAGUARD_STRICT": "1"}
    for _ in range(2):
        run = run_python(pod, SAYS_PID + RESOLVE_PLATFORM, env)
        assert run.returncode == 1 and "stopped start-up: TMAGUARD_LOG_FORMAT='xml'" in run.stderr
    assert entries(run.record_dir) == []


def test_validate_mode_replays_and_changes_nothing(pods, run_python) -> None:
    pod = pods("vcuda", cc="9.0")
    env = {"TMAGUARD_MODE": "validate"}
    first = run_python(pod, SAYS_PID + GUARD_ONLY, env)
    # The replay, the guard alone: it changes nothing vLLM's start would meet (nothing loaded), so vLLM fails
    # as with the guard off (faultkit.GUARD_EFFECTS; test_guard_vllm.py's validate-mode test).
    later = run_python(pod, SAYS_PID + GUARD_EFFECTS, env)
    assert record(later)["replayed_from"] == record(first)["pid"]
    assert (later.returncode, later.result) == (0, NO_EFFECTS)


@pytest.mark.parametrize("damage", ["writable by others", "a link", "not JSON", "another version"])
def test_a_cache_file_that_is_not_ours_alone_is_ignored(pods, run_python, tmp_path, damage) -> None:
    pod = pods("vcuda", cc="9.0")
    first = run_python(pod, SAYS_PID + GUARD_ONLY)
    cache = first.record_dir / "verdicts.json"
    if damage == "writable by others":  # readable by others is no concern: nobody else could have written it
        cache.chmod(0o646)
    elif damage == "a link":
        stored = tmp_path / "elsewhere.json"
        cache.rename(stored)
        cache.symlink_to(stored)
    elif damage == "not JSON":
        cache.write_text("{")
    else:
        cache.write_text(cache.read_text().replace('"tmaguard": "', '"tmaguard": "0.0.0-'))
    # vLLM starts on the fresh verdict once (the first case); in the others the guard alone shows the same
    # decisions, the same process for vLLM.
    starts_vllm = damage == "writable by others"
    later = run_python(pod, SAYS_PID + (RESOLVE_PLATFORM if starts_vllm else GUARD_ONLY))
    assert record(later).get("replayed_from") is None
    assert decisions(record(later)) == decisions(record(first))
    if starts_vllm:
        assert "error" not in later.result, later.result
    if damage != "a link":  # the full run stored its verdict anew; the next process replays it
        again = run_python(pod, SAYS_PID + GUARD_ONLY)
        assert record(again)["replayed_from"] == record(later)["pid"]


def test_a_forked_child_of_a_replaying_process_records_itself(pods, run_python) -> None:
    """The parent replays; its forked child issues its own record naming the parent's pid (taken by the
    parent itself before the fork, not from what the guard returned)."""
    pod = pods("vcuda", cc="9.0")
    first = run_python(pod, SAYS_PID + GUARD_ONLY)
    code = """
import json, os
from vllm_tmaguard.guard import activate
parent = os.getpid()
activate("test")
pid = os.fork()
if pid == 0:
    activate("test")
    print("RESULT " + json.dumps({"parent": parent, "child": os.getpid()}), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""
    later = run_python(pod, code)
    parent_pid, child_pid = later.result["parent"], later.result["child"]
    assert child_pid != parent_pid
    parent, child = later.record_of(parent_pid), later.record_of(child_pid)
    assert parent["replayed_from"] == record(first)["pid"] and parent["forked_from"] is None
    assert child["forked_from"] == parent_pid and child["replayed_from"] is None
    assert child["outcome"] == parent["outcome"] and child["actions"] == parent["actions"]


def test_a_replay_imports_none_of_the_full_runs_modules(pods, run_python) -> None:
    """What keeps it cheap in every process (bench/guard_cost.py measures the time). Redaction's only where
    a variable the stages do not read has a value that shows in the record and the storing process did not
    have it (here the stand-ins' GPU name and LD_LIBRARY_PATH show, both the storing process's: judged
    there, so not imported). The trust check of a library it loads (here the overlay, checked again before
    it is loaded: tests/adversarial/test_adv_verdict_cache.py) is the door's own (files.py)."""
    pod = pods("vcuda", cc="9.0")
    run_python(pod, SAYS_PID + GUARD_ONLY)
    code = "import sys\nfrom vllm_tmaguard.guard import activate\nactivate('test')\n" + (
        "watched = [m for m in sys.modules if m.startswith(('vllm_', 'yaml'))]\n"
        "print('RESULT ' + __import__('json').dumps(sorted(watched)))"
    )
    later = run_python(pod, code)
    assert set(later.result) == {
        "vllm_tmaguard", "vllm_tmaguard._import_hook", "vllm_tmaguard.files", "vllm_tmaguard.guard",
        "vllm_tmaguard.process", "vllm_tmaguard.verdict", "vllm_tmaguard.codes", "vllm_tmaguard.issue",
    }  # fmt: skip
    assert os.path.exists(later.record_dir / "verdicts.json")
