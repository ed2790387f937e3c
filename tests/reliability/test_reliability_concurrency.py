"""Concurrency: many threads at the first encoder call and at activation, many vLLM processes sharing the
record directory.

The method (each fault against the same vLLM start-up with the guard off): tests/faultkit.py."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from faultkit import GUARD_ONLY, RESOLVE, Child
from podkit import expected_descriptor

FIRST_ENCODES = r"""
import ctypes, json, os, threading
from vllm_tmaguard import _import_hook
_import_hook.disarm()
from vllm_tmaguard.guard import activate
activate("test")  # loads the overlay or the shims
driver = ctypes.CDLL("libcuda.so.1")  # the overlay, or (shims) the layer itself
assert driver.cuInit(0) == 0  # what every CUDA program does first: the layer loads its real driver
if os.environ["TMAGUARD_OVERLAY"] == "auto":
    library = driver  # the overlay answers libcuda.so.1
else:
    library = ctypes.CDLL(None)  # the encoders shim, in the global scope
encode = library.cuTensorMapEncodeTiled
u64, u32 = ctypes.c_uint64, ctypes.c_uint32
encode.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p, ctypes.POINTER(u64),
                   ctypes.POINTER(u64), ctypes.POINTER(u32), ctypes.POINTER(u32)] + [ctypes.c_int] * 4
THREADS = 64
start = threading.Barrier(THREADS)
results = [None] * THREADS
def first_call(i):
    descriptor = (ctypes.c_ubyte * 128)()
    dim, stride, box, element = (u64 * 1)(4096 + i), (u64 * 1)(8192), (u32 * 1)(64), (u32 * 1)(1)
    address = 0x7F0000000000 + i * 0x1000
    start.wait()
    status = encode(descriptor, 7, 1, address, dim, stride, box, element, 0, 0, 0, 0)  # releases the GIL
    results[i] = [status, bytes(descriptor).hex(), address, 4096 + i]
threads = [threading.Thread(target=first_call, args=(i,)) for i in range(THREADS)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
source = library.tmaguard_shim_source(b"cuTensorMapEncodeTiled")
print("RESULT " + json.dumps({"calls": results, "source": source}))
"""


@pytest.mark.parametrize("overlay", ["auto", "off"])
def test_64_threads_first_encoder_call(pods, tmp_path: Path, overlay: str) -> None:
    """64 threads released at once make the process's first encoder call (the one that resolves the real
    encoder, lock-free) through the overlay or the shim: every call returns the real driver's
    descriptor, none an error. The driver numbers its calls; everything else in each descriptor is fixed
    by the arguments. Five processes each, for five chances at the race."""
    pod = pods("vcuda")
    env = {"TMAGUARD_OVERLAY": overlay}
    children = [Child(pod, FIRST_ENCODES, tmp_path / f"run-{n}", env) for n in range(5)]
    for child in children:
        result = child.collect(120).outcome
        assert result is not None
        calls = result["calls"]
        assert [status for status, *_ in calls] == [0] * 64
        numbers = []
        for _, descriptor, address, dim in calls:
            data = bytes.fromhex(descriptor)
            numbers.append(int.from_bytes(data[40:48], "little"))
            assert data == expected_descriptor(7, 1, address, dim, numbers[-1])
        assert sorted(numbers) == list(range(1, 65))  # each call reached the real driver exactly once
        assert result["source"] == 3  # the real driver the layer loaded (csrc/tmaguard.h)


ACTIVATE_FROM_THREADS = r"""
import json, threading
from vllm_tmaguard import _import_hook
_import_hook.disarm()
from vllm_tmaguard import guard
THREADS = 32
start = threading.Barrier(THREADS)
records = [None] * THREADS
def go(i):
    start.wait()
    records[i] = guard.activate(f"thread-{i}")
threads = [threading.Thread(target=go, args=(i,)) for i in range(THREADS)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
maps = open("/proc/self/maps").read().splitlines()
overlays = sorted({line.split()[-1] for line in maps if "/overlay-" in line})
print("RESULT " + json.dumps({
    "one_record": all(r == records[0] for r in records) and records[0] is not None,
    "trigger": records[0]["trigger"], "overlays": overlays,
}))
"""


def test_activation_from_many_threads_is_one_activation(pods, tmp_path: Path) -> None:
    run = Child(pods("vcuda"), ACTIVATE_FROM_THREADS, tmp_path).collect(120)
    result = run.outcome
    assert result["one_record"] is True and result["trigger"].startswith("thread-")
    assert len(result["overlays"]) == 1
    run.line()  # exactly one record line


# The guard alone, as vLLM's import hook runs it, then which overlay file the process mapped.
GUARD_AND_OVERLAY = GUARD_ONLY + (
    "import json\nmaps = open('/proc/self/maps').read().splitlines()\n"
    "print('RESULT ' + json.dumps({'overlay': sorted({l.split()[-1] for l in maps if '/overlay-' in l})}))\n"
)


def test_concurrent_vllm_processes_share_the_record_directory(pods, tmp_path: Path) -> None:
    """Eight processes start at once with one TMAGUARD_RECORD_DIR, empty at first. Each activates once
    (one line, its own pid) and loads the overlay file they share; two of them start vLLM on it, the
    other six are the guard alone (the record directory is shared in the activation, which vLLM's import
    hook runs first thing: all eight activate together); meanwhile the shared files are read over and over:
    never a partial file. Afterwards: one overlay file holding exactly the overlay image, one valid scan
    cache, a valid last.json from one of the processes, no temporary file left, every directory 0700."""
    from vllm_tmaguard.stages.overlay import overlay_image

    pod = pods("vcuda")
    records = tmp_path / "shared-records"
    children = [
        Child(pod, RESOLVE if n < 2 else GUARD_AND_OVERLAY, tmp_path / f"run-{n}", record_dir=records)
        for n in range(8)
    ]
    reads, bad = [0], []
    finished = threading.Event()

    def reader() -> None:
        while not finished.is_set():
            names = os.listdir(records) if records.is_dir() else []
            for path in (records / n for n in names if n.endswith(".json") and not n.startswith(".")):
                try:
                    json.loads(path.read_text())
                    reads[0] += 1
                except FileNotFoundError:
                    pass  # replaced between the listing and the read
                except ValueError as error:
                    bad.append(f"{path.name}: {error}")
            time.sleep(0.001)

    watcher = threading.Thread(target=reader)
    watcher.start()
    try:
        results = [child.collect(300) for child in children]
    finally:
        finished.set()
        watcher.join()
    assert bad == [] and reads[0] > 0
    pids = set()
    (overlay_file,) = records.glob("overlay-*/libcuda.so.1")
    for n, run in enumerate(results):
        if n < 2:
            assert run.outcome == {"platform": "NvmlCudaPlatform"}, run.stdout + run.stderr
        else:
            assert run.outcome == {"overlay": [str(overlay_file)]}, run.stdout + run.stderr
        line = run.line()
        assert "overlay loaded" in line, line
        pids.add(int(line.split("pid=", 1)[1].split(")", 1)[0]))
    assert len(pids) == 8
    last = json.loads((records / "last.json").read_text())
    assert last["pid"] in pids
    (scan,) = records.glob("vllm-scan-*.json")
    scanned = json.loads(scan.read_text())
    modules = {e["module"] for e in scanned["extensions"]}
    assert scanned["package_dir"] and {"vllm._C_stable_libtorch", "vllm._moe_C_stable_libtorch"} <= modules
    (overlay_dir,) = records.glob("overlay-*")
    assert [p.name for p in overlay_dir.iterdir()] == ["libcuda.so.1"]
    layer = pod.lib_dir / "libcuda.so.1"
    assert (overlay_dir / "libcuda.so.1").read_bytes() == overlay_image(str(layer))
    assert [p.name for p in records.iterdir() if p.name.startswith(".")] == []
    for directory in (records, overlay_dir):
        assert directory.stat().st_mode & 0o777 == 0o700
