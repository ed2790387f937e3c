"""Every file the package reads back, fuzzed (hypothesis): the record (last.json, as the doctor and
`tmaguard record` read it), the verdict cache, the vLLM scan cache, and the kernel module's /proc files. The
readers are the package's own, run in this process on files written as a co-tenant, a crash or a bug could
leave them; each must answer (a value, a miss, a finding), never raise, and never hand on a value of the
wrong shape. The documents mutated are real ones: written by the guard's own full run on an emulated pod."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_tmaguard import files, verdict
from vllm_tmaguard.doctor.hooks import read_record
from vllm_tmaguard.doctor.record_shape import why_not_a_record
from vllm_tmaguard.process import eager_flag
from vllm_tmaguard.stages import gpu, scan_cache

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@pytest.fixture(scope="module")
def written(pods, tmp_path_factory) -> dict[str, Any]:
    """The guard's own files from one full run on an emulated vCUDA pod: last.json, verdicts.json, the scan
    cache."""
    import subprocess
    import sys

    from podkit import child_environ

    pod = pods("vcuda", cc="9.0")
    records = tmp_path_factory.mktemp("fuzz-records")
    env = child_environ(pod, records / "r")
    subprocess.run(
        [sys.executable, "-c", "from vllm_tmaguard.guard import activate; activate('fuzz')"],
        env=env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    directory = records / "r"
    (scan,) = directory.glob("vllm-scan-*.json")
    return {
        "last": json.loads((directory / "last.json").read_text()),
        "verdicts": json.loads((directory / "verdicts.json").read_text()),
        "scan": json.loads(scan.read_text()),
        "scan_name": scan.name,
        "package_dir": json.loads(scan.read_text())["package_dir"],
    }


def mutated(document: Any, data: st.DataObject) -> Any:
    """`document` with one of its values (at any depth) replaced, removed or retyped."""
    if isinstance(document, dict) and document:
        key = data.draw(st.sampled_from(sorted(document)))
        how = data.draw(st.sampled_from(["replace", "remove", "descend"]))
        if how == "remove":
            return {k: v for k, v in document.items() if k != key}
        value = data.draw(JSON) if how == "replace" else mutated(document[key], data)
        return {**document, key: value}
    if isinstance(document, list) and document:
        index = data.draw(st.integers(0, len(document) - 1))
        return [*document[:index], mutated(document[index], data), *document[index + 1 :]]
    return data.draw(JSON)


def private_dir(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name
    directory.mkdir(mode=0o700, exist_ok=True)
    directory.chmod(0o700)
    return directory


def put(directory: Path, name: str, data: bytes) -> None:
    path = directory / name
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@FUZZ
@given(data=st.data())
def test_the_doctor_reads_any_last_json(written, tmp_path, data) -> None:
    directory = private_dir(tmp_path, "doctor")
    document = data.draw(st.sampled_from(["mutated", "json", "bytes", "deep"]))
    if document == "mutated":
        content = json.dumps(mutated(written["last"], data)).encode()
    elif document == "json":
        content = json.dumps(data.draw(JSON)).encode()
    elif document == "deep":
        content = deep(data.draw(st.integers(900, 200_000)))
    else:
        content = data.draw(st.binary(max_size=300))
    put(directory, "last.json", content)
    found = read_record(str(directory))
    assert found["found"] != bool(found["error"]) or not found["found"]
    if found["found"] and found["record"].get("schema") == 2:
        assert why_not_a_record(found["record"]) is None
    if found["error"]:
        assert str(directory / "last.json") in found["error"]


# The verdict cache entry's shape, written here from what its readers use (verdict._matching, _issuable,
# _replayable_here, redo: each field's type, each row's length), not from the package's own check of it
# (verdict._shaped): a check that waved a damaged entry through would otherwise be its own oracle.
ANY = object()


class ListOf(NamedTuple):
    item: Any


class Row(NamedTuple):  # a list of exactly these
    items: tuple[Any, ...]


class MapOf(NamedTuple):
    key: Any
    value: Any


class OneOf(NamedTuple):
    values: tuple[Any, ...]


ENTRY_SHAPE = {
    "process": {"library": str, "env": dict, "env_names": ListOf(str), "env_prefixes": ListOf(str)},
    "files": ListOf(Row((ANY, str, ANY))),  # (kind, path, observation)
    "record": {"pid": int},
    "log_format": OneOf(("text", "json")),
    "secret_min": int,
    "shown": MapOf(str, str),  # the variables the record shows, judged no secret (_replayable_here)
    "redo": {
        "load": ListOf(Row((str, bool, ANY))),  # (path, global scope, the name it must answer)
        "env": MapOf(str, str),
        "block": ListOf(str),
        "args": ListOf(Row((str, str))),
    },
}


def fits(value: Any, shape: Any = ENTRY_SHAPE) -> bool:
    """Whether `value` has `shape` (a dict: these keys at least, each of its shape)."""
    if shape is ANY:
        return True
    if isinstance(shape, type):
        return isinstance(value, shape)
    if isinstance(shape, OneOf):
        return any(value == v and type(value) is type(v) for v in shape.values)
    if isinstance(shape, MapOf):
        return isinstance(value, dict) and all(
            fits(k, shape.key) and fits(v, shape.value) for k, v in value.items()
        )
    if isinstance(shape, (ListOf, Row)) and not isinstance(value, list):
        return False
    if isinstance(shape, ListOf):
        return all(fits(item, shape.item) for item in value)
    if isinstance(shape, Row):
        return len(value) == len(shape.items) and all(map(fits, value, shape.items))
    return isinstance(value, dict) and all(k in value and fits(value[k], s) for k, s in shape.items())


def damaged(value: Any, depth: int) -> Iterator[Any]:
    """`value` with one of its parts (down to `depth` levels) removed or retyped, each way in turn."""
    yield None
    yield 0 if isinstance(value, str) else "x"
    if depth == 0 or not isinstance(value, (dict, list)):
        return
    if isinstance(value, dict):
        for key in value:
            yield {k: v for k, v in value.items() if k != key}
            for part in damaged(value[key], depth - 1):
                yield {**value, key: part}
    else:
        for index, item in enumerate(value):
            yield [*value[:index], *value[index + 1 :]]
            for part in damaged(item, depth - 1):
                yield [*value[:index], part, *value[index + 1 :]]


def test_the_verdict_cache_keeps_exactly_the_entries_of_its_shape(written, tmp_path) -> None:
    """Every single damage to a real entry (a field removed or retyped, a row shortened), each field of its
    replay plan filled: loaded when it still has the entry's shape (ENTRY_SHAPE), dropped when it has not.
    Deterministic, where the fuzz below may miss a field."""
    directory = private_dir(tmp_path, "sweep")
    entry = written["verdicts"]["entries"][0]
    redo = {**entry["redo"], "env": {"K": "v"}, "block": ["m"], "args": [["--flag", "v"]]}
    entry = {**entry, "files": entry["files"][:3], "redo": redo}
    assert fits(entry) and entry["redo"]["load"]
    wrong = []
    for candidate in [entry, *damaged(entry, 3)]:
        document = {**written["verdicts"], "entries": [candidate]}
        put(directory, verdict.CACHE_FILE, json.dumps(document).encode())
        if bool(verdict.load_entries(str(directory))) != fits(candidate):
            wrong.append(candidate)
    assert wrong == [], f"{len(wrong)} entries loaded or dropped against their shape, e.g. {wrong[0]}"


@FUZZ
@given(data=st.data())
def test_the_verdict_cache_reads_any_file(written, tmp_path, data) -> None:
    directory = private_dir(tmp_path, "verdicts")
    if data.draw(st.booleans()):
        content = json.dumps(mutated(written["verdicts"], data)).encode()
    else:
        content = data.draw(st.sampled_from([deep(100_000), b"", b"{", b"[]", b'{"format": 2}']))
    put(directory, verdict.CACHE_FILE, content)
    entries = verdict.load_entries(str(directory))
    assert isinstance(entries, list) and all(verdict._shaped(entry) for entry in entries)
    assert all(fits(entry) for entry in entries)  # the shape as its readers use it, not _shaped's word
    verdict._matching(entries)  # compares without raising, whatever the shapes inside


@FUZZ
@given(data=st.data())
def test_the_scan_cache_reads_any_file(written, tmp_path, data) -> None:
    directory = private_dir(tmp_path, "scan")
    if data.draw(st.booleans()):
        content = json.dumps(mutated(written["scan"], data)).encode()
    else:
        content = data.draw(st.sampled_from([deep(100_000), b"[]", b"null", b"\xff\xfe"]))
    put(directory, written["scan_name"], content)
    facts = scan_cache.load(str(directory), written["package_dir"])
    if facts is not None:
        assert all(isinstance(symbol, str) for e in facts.extensions for symbol in e.driver_symbols)
        assert isinstance(facts.platform_plugins, bool)


@FUZZ
@given(version=st.binary(max_size=400), information=st.binary(max_size=400), minor=st.text(max_size=4))
def test_the_gpus_from_any_proc_files(tmp_path_factory, version, information, minor) -> None:
    root = tmp_path_factory.mktemp("proc")
    proc = root / "proc/driver/nvidia"
    (proc / "gpus/0000:01:00.0").mkdir(parents=True)
    (proc / "version").write_bytes(version)
    (proc / "gpus/0000:01:00.0/information").write_bytes(information + f"\nDevice Minor: {minor}\n".encode())
    (root / "dev").mkdir()
    (root / "dev/nvidia0").write_bytes(b"")
    facts = gpu.probe_gpus(str(root))
    assert all(isinstance(g.name, str) for g in facts.gpus)


def test_a_proc_file_that_is_a_fifo_or_endless_is_refused(tmp_path) -> None:
    """The door's bound and type check on a system file: a FIFO is not opened for reading as a file, and a
    file longer than the cap is refused, not read into memory; the GPU probe given a FIFO for its file finds
    no kernel module, at once."""
    fifo = tmp_path / "version"
    os.mkfifo(fifo)
    with pytest.raises(files.Refused, match="FIFO"):
        files.read_bytes(str(fifo))
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(files.Refused, match="more than the 1024"):
        files.read_bytes(str(big), 1024)
    assert gpu.probe_gpus(str(tmp_path)).gpus == ()
    # The probe itself meets the FIFO where it reads the kernel module's version file, a writer holding it
    # open (a blocking open or read would wait for ever): no kernel module, no GPU.
    root = tmp_path / "pod"
    proc = root / "proc/driver/nvidia"
    (proc / "gpus/0000:01:00.0").mkdir(parents=True)
    (proc / "gpus/0000:01:00.0/information").write_text("Model: NVIDIA H100 80GB HBM3\nDevice Minor: 0\n")
    (root / "dev").mkdir()
    (root / "dev/nvidia0").write_bytes(b"")
    os.mkfifo(proc / "version")
    writer = os.open(proc / "version", os.O_RDWR | os.O_NONBLOCK)
    try:
        facts = gpu.probe_gpus(str(root))
    finally:
        os.close(writer)
    assert facts.gpus == () and facts.error.startswith("no NVIDIA kernel module"), facts
    # The same pod with the file as the kernel module makes it: its GPU (the FIFO was where the probe reads).
    (proc / "version").unlink()
    (proc / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05\n")
    assert [g.name for g in gpu.probe_gpus(str(root)).gpus] == ["NVIDIA H100 80GB HBM3"]


FLAG_WORDS = st.sampled_from(
    ["--enforce-eager", "--no-enforce-eager", "-O", "-O0", "-O=1", "--optimization-level", "-cc",
     "--compilation-config", "-cc.cudagraph_mode", "--compilation-config.cudagraph_mode=NONE", "0", "NONE",
     '{"cudagraph_mode": "NONE"}', '{"cudagraph_mode": 7}', "[" * 100_000, "=", ""]
)  # fmt: skip


@FUZZ
@given(argv=st.lists(FLAG_WORDS | st.text(max_size=30), max_size=12))
def test_any_command_line_gives_an_eager_flag_or_none(argv) -> None:
    """The process's command line (process.py) is read by every guarded process: any words, vLLM's flags
    among them, a compilation config nested past JSON's depth, give a flag as written or None."""
    found = eager_flag(["vllm", *argv])
    assert found is None or (isinstance(found, str) and found.split()[0] in argv)


CONFIG_KEYS = st.sampled_from(
    ["enforce_eager", "enforce-eager", "optimization-level", "optimization_level", "compilation-config",
     "compilation_config", "compilation-config.cudagraph_mode", "seed"]
) | st.text(max_size=12) | st.integers()  # fmt: skip


@FUZZ
@given(config=st.dictionaries(CONFIG_KEYS, JSON, max_size=6), argv=st.lists(FLAG_WORDS, max_size=4))
def test_any_config_file_mapping_gives_an_eager_flag_or_none(config, argv) -> None:
    """A `--config` file's mapping (launch.config_args; any YAML vLLM's loader can give, keys of any type
    among them) with any command line after it gives a flag or None, the file's marked as from the file."""
    found = eager_flag(["vllm", "serve", "M", "--config", "c.yaml", *argv], config)
    assert found is None or found.endswith(" (in --config c.yaml)") or found.split()[0] in argv
