"""The verdict cache under attack (issue 25, items 4, 6 and 7; vllm_tmaguard/verdict.py): a later process of a
pod replays the first one's verdict only while everything it was decided from is as it was, and only after
the trust check of every library the verdict loads, run again. A library made untrusted, a libcuda.so.1
whose content changed in the same inode with its size and modification time kept (`touch -r`): each sends
the later process to the full run, which decides afresh on what is there now."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from advkit_b import (
    ACTIVATE,
    PRINT_MAPS,
    SAYS_PID,
    decided_afresh,
    maps,
    own_pid,
    own_record,
    padded,
    restamp,
    rewrite_in_place,
)
from test_guard_vllm import RESOLVE_PLATFORM, UNDEFINED

import vllm_tmaguard

# Another user's uid (nobody on this machine has it): the owner an attacker's chown gives.
OTHER_UID = 48611


def _package_copy(tmp_path: Path) -> Path:
    """This package copied to a directory put first on PYTHONPATH: its shims' directory can be made untrusted
    without touching the installed package other tests use."""
    site = tmp_path / "site"
    shutil.copytree(Path(vllm_tmaguard.__file__).parent, site / "vllm_tmaguard")
    return site


@pytest.mark.parametrize("library", ["overlay", "shims"])
def test_a_replay_rechecks_the_trust_of_every_library_it_loads(pods, run_python, tmp_path, library) -> None:
    """Item 4: a replay loaded every library its stored verdict lists without the trust check. Attack: after
    a full run stored a verdict that loads the overlay (the private directory's overlay-*/libcuda.so.1) or
    the package's shims, that file is given to another uid (overlay) or its directory made writable by
    others (shims). Every check of a file's stat sees such a change, so the stored observations of the
    changed path are rewritten to match it again (advkit_b.restamp): the stored inputs alone would replay.
    A harmless change (a mode still trusted) restamped the same way is replayed, which shows they match; the
    untrusting one must not be: the later process loads nothing from the untrusted file and goes to the full
    run, which refuses it (a fresh overlay written over it; the shims as a record problem)."""
    pod = pods("vcuda", cc="9.0")
    env: dict[str, str] = {}
    if library == "shims":
        site = _package_copy(tmp_path)
        env = {"TMAGUARD_OVERLAY": "off", "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    first = run_python(pod, ACTIVATE, env)
    stored = own_record(first)
    loaded = [a["value"] for a in stored["actions"] if a["kind"] in ("load-overlay", "load-shim")]
    assert loaded and set(loaded) <= set(maps(first)) and decided_afresh(stored)
    if library == "shims":
        assert all(path.startswith(str(site)) for path in loaded)
        target = Path(loaded[0]).parent  # the shims' directory: a component of each one's path
        harmless, untrusting = (lambda: target.chmod(0o750)), (lambda: target.chmod(0o757))
    else:
        (target,) = map(Path, loaded)
        harmless, untrusting = (lambda: target.chmod(0o400)), (lambda: os.chown(target, OTHER_UID, OTHER_UID))

    before = os.lstat(target)
    harmless()
    assert restamp(first.record_dir, target, before) >= 1
    control = run_python(pod, ACTIVATE, env)
    assert own_record(control)["replayed_from"] == own_pid(first)  # the restamped inputs match

    before = os.lstat(target)
    untrusting()
    assert restamp(first.record_dir, target, before) >= 1
    untrusted_inode = os.lstat(target).st_ino
    later = run_python(pod, ACTIVATE, env)
    record, mapped = own_record(later), maps(later)
    assert decided_afresh(record), record.get("replayed_from")
    if library == "overlay":  # the full run wrote the overlay afresh, as this user's, and loaded that file
        assert mapped.get(str(target)) != untrusted_inode
        fresh = os.lstat(target)
        assert (fresh.st_uid, fresh.st_mode & 0o777) == (os.geteuid(), 0o500)
        assert mapped[str(target)] == fresh.st_ino and record["outcome"] == "supplied"
    else:  # nothing is loaded from the shims' directory: each shim is a problem that says why
        assert not any(path.startswith(str(site)) for path in mapped)
        problems = {p["subject"]: p for p in record["problems"] if p["code"] == "shim-failed"}
        assert set(problems) == {"encoders", "proc-address"}
        assert all(f"{target} is writable by others" in p["cause"] for p in problems.values())
        assert record["outcome"] == "degraded"


# Resolves vLLM's platform (its CUDA extension binds cuTensorMapEncodeTiled), then what the process mapped.
VLLM_START = SAYS_PID + RESOLVE_PLATFORM + PRINT_MAPS


@pytest.mark.parametrize("became", ["layer", "driver"])
def test_a_content_change_keeping_size_and_mtime_is_a_changed_input(pods, run_python, became) -> None:
    """Item 6: the cache key (mode, inode, dev, size, mtime, uid, gid) missed a content change in place that
    keeps the size and the modification time. Attack: libcuda.so.1 (a file of its own) holds the real driver
    and becomes the vCUDA layer in the same inode, or the reverse, both padded to one size, the modification
    time put back. At 1cc570e the first replayed "has every entry point needed" and vLLM died with
    `undefined symbol: cuTensorMapEncodeTiled`; the second replayed "overlay loaded" over the real driver.
    The later vLLM process must decide afresh, start, and record what libcuda.so.1 is now."""
    pod = pods("vcuda", cc="9.0")
    driver, layer = pod.real_driver.read_bytes(), (pod.lib_dir / "libcuda-control.so").read_bytes()
    size = max(len(driver), len(layer))
    content = {"driver": padded(driver, size), "layer": padded(layer, size)}
    libcuda = pod.lib_dir / "libcuda.so.1"
    libcuda.unlink()  # was one of the layer's hard links (with NVML's): now a file of its own
    libcuda.write_bytes(content["driver" if became == "layer" else "layer"])
    libcuda.chmod(0o755)

    # The first process stores the verdict: the guard alone. vLLM's start on each content, decided afresh,
    # is the later process of the other case.
    first = run_python(pod, ACTIVATE)
    assert own_record(first)["outcome"] == ("nothing-missing" if became == "layer" else "supplied")
    rewrite_in_place(libcuda, content[became])

    later = run_python(pod, VLLM_START)
    record = own_record(later)
    assert decided_afresh(record), f"replayed {record['outcome']!r} from pid {record['replayed_from']}"
    assert "error" not in later.result, later.result  # vLLM started: no undefined symbol
    assert UNDEFINED not in later.stdout + later.stderr
    if became == "layer":  # the layer lacks the encoders: the overlay stands in for libcuda.so.1
        assert record["outcome"] == "supplied" and set(record["supplied"].values()) == {"overlay"}
        assert "cuTensorMapEncodeTiled" in record["supplied"]
        assert any("/overlay-" in path for path in maps(later))
    else:  # the real driver has every entry point: nothing is loaded
        assert record["outcome"] == "nothing-missing" and record["actions"] == []
        assert not any("/overlay-" in path or "tmaguard" in path for path in maps(later))
    again = run_python(pod, ACTIVATE)  # the guard alone: its part is to show which verdict is stored
    assert own_record(again)["replayed_from"] == own_pid(later)  # the fresh verdict is the one kept


# Where the layer's own entry points answer vLLM's calls: the stand-in layer counts each call it receives.
LAYER_CALLS = (
    SAYS_PID
    + RESOLVE_PLATFORM.replace('print("RESULT "', "#")
    + """
import ctypes, os, sys
sys.path.insert(0, os.environ["DRIVER_CALLS_DIR"])
import driver_calls
layer = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
layer.standin_layer_calls.restype = ctypes.c_longlong
names = ["cuTensorMapEncodeTiled", "cuGetProcAddress_v2"]
out["init"] = driver_calls.init()
before = {n: layer.standin_layer_calls(n.encode()) for n in names}
out["encode"] = driver_calls.encode_tiled(0x7F0000001000, 4096)[0]
out["proc_address"] = list(driver_calls.alloc_through_proc_address())
out["layer_calls"] = {n: [before[n], layer.standin_layer_calls(n.encode())] for n in names}
print("RESULT " + json.dumps(out))
"""
    + PRINT_MAPS
)


def test_a_layer_replaced_in_place_by_one_with_the_entry_points_gets_no_stale_shims(
    pods, run_python, standins
) -> None:
    """Item 7: with TMAGUARD_OVERLAY=off, vCUDA's library replaced in place (the device plugin's hard links
    all see it) by a fork that exports cuGetProcAddress_v2 and the encoders, its size and modification time
    kept, still got the stale shims, whose exports hide the layer's own. The later process must load no
    shim, and vLLM's calls must reach the layer's own entry points (its call counters)."""
    pod = pods("vcuda", cc="9.0")
    env = {"TMAGUARD_OVERLAY": "off", "DRIVER_CALLS_DIR": str(standins["driver_calls_ext"].parent)}
    control = pod.lib_dir / "libcuda-control.so"  # libcuda.so.1 and libnvidia-ml.so.1 are this inode
    master, fork = control.read_bytes(), standins["layer_fork"].read_bytes()
    size = max(len(master), len(fork))
    with open(control, "r+b") as file:  # padded before the first run: the fork then fits in the same size
        file.write(padded(master, size))
    assert os.stat(pod.lib_dir / "libcuda.so.1").st_ino == control.stat().st_ino

    first = run_python(pod, LAYER_CALLS, env)
    assert set(own_record(first)["supplied"].values()) == {"encoders", "proc-address"}
    assert first.result["layer_calls"]["cuTensorMapEncodeTiled"] == [-1, -1]  # the master has no encoder
    rewrite_in_place(control, padded(fork, size))

    later = run_python(pod, LAYER_CALLS, env)
    record, result = own_record(later), later.result
    assert decided_afresh(record), f"replayed {sorted(record['supplied'].values())} shims"
    assert "error" not in result, result
    assert not any("tmaguard" in path for path in maps(later))
    loads = [a for a in record["actions"] if a["kind"] in ("load-shim", "load-overlay")]
    assert record["supplied"] == {} and loads == []  # (the toggle's carry to Ray workers is set, issue 33)
    # Its own look-up swaps legacy hooks in by base name, which no shim can answer around: said, not hidden.
    assert record["outcome"] == "degraded" and [p["code"] for p in record["problems"]] == ["lookup-swapped"]
    assert [layer["name"] for layer in record["layers"]] == ["vcuda-fork"]
    assert result["encode"] == 0 and result["proc_address"][:2] == [0, 0]
    calls = {name: after - before for name, (before, after) in result["layer_calls"].items()}
    assert calls == {"cuTensorMapEncodeTiled": 1, "cuGetProcAddress_v2": 1}  # the fork's own exports
