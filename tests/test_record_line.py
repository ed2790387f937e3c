"""The guard's one log line on every kind of emulated pod (podkit.KINDS: a kind added later is covered
here by itself): within podkit.GUARD_LINE_LIMIT, and it says the outcome, what was loaded, the first
problem's cause and fix, the routing, and where the full record is, which holds the same summary and the
detail the line leaves out. The line is rendered from the record's fields (record.render_line)."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from podkit import GUARD_LINE_LIMIT, KINDS

GPUS = {"rtx4090": {}, "h100": {"gpu_name": "NVIDIA H100 80GB HBM3", "cc": "9.0"}}
SETTINGS = {
    "default": {},
    "overlay-off": {"TMAGUARD_OVERLAY": "off"},
    "validate": {"TMAGUARD_MODE": "validate"},
}


@pytest.fixture
def records() -> Iterator[str]:
    """A record directory as short as the default one (/tmp/tmaguard-<uid>), so no part is cut for room."""
    directory = tempfile.mkdtemp(prefix="tg-")
    yield directory
    shutil.rmtree(directory)


ACTIVATE = "from vllm_tmaguard.guard import activate; activate('test'); print('RESULT {}')"


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("kind", KINDS)
def test_one_short_line_that_points_at_the_full_record(pods, run_python, records, kind, gpu, setting) -> None:
    env = {**SETTINGS[setting], "VLLM_LOGGING_LEVEL": "DEBUG", "TMAGUARD_RECORD_DIR": records}
    run = run_python(pods(kind, **GPUS[gpu]), ACTIVATE, env)
    (line,) = run.guard_lines()  # run_python has checked the length of every guard line already
    assert len(line) <= GUARD_LINE_LIMIT
    message = line.split("] ", 1)[1]
    if kind == "nogpu":
        assert message.startswith("tmaguard: no GPU and no libcuda.so.1")
        return
    record = json.loads((Path(records) / "last.json").read_text())
    assert record["pid"] == int(line.split()[1].removeprefix("pid=").rstrip(")"))
    assert message.startswith(f"tmaguard: {record['summary']}")
    kinds = {a["kind"] for a in record["actions"]}
    if "load-overlay" in kinds:
        assert "overlay loaded" in message or "overlay would be loaded" in message
    elif "load-shim" in kinds:
        assert re.search(r"shims (loaded|would be loaded) \(", message)
    if record["problems"]:  # the first problem's cause and its fix are always there, whatever is cut
        first = record["problems"][0]
        assert re.search(r"PROBLEM( \(\d+\))?: " + re.escape(first["cause"][:60]), message)
        assert f"fix: {first['fix'][:60]}" in message
    else:
        assert message.endswith(f"details: {record['record_file']}")
        assert re.search(r"; routing: [^;…]+; details: ", message) or record["routing"] is None
