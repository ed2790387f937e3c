"""The guard's one log line on every kind of emulated pod (podkit.KINDS: a kind added later is covered
here by itself): within podkit.GUARD_LINE_LIMIT, and it says the outcome, what was loaded, the routing,
and where the full record is, which holds the same summary and the detail the line leaves out."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from podkit import GUARD_LINE_LIMIT, KINDS

GPUS = {"rtx4090": {}, "h100": {"gpu_name": "NVIDIA H100 80GB HBM3", "cc": "9.0"}}
SETTINGS = {
    "default": {},
    "overlay-off": {"TMAGUARD_OVERLAY": "off"},
    "validate": {"TMAGUARD_MODE": "validate"},
}
ACTIVATE = "from vllm_tmaguard.guard import activate; activate('test'); print('RESULT {}')"


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("kind", KINDS)
def test_one_short_line_that_points_at_the_full_record(pods, run_python, kind, gpu, setting) -> None:
    # A record directory as short as the default one (/tmp/tmaguard-<uid>), so no part is cut for room.
    records = tempfile.mkdtemp(prefix="tg-")
    env = {**SETTINGS[setting], "VLLM_LOGGING_LEVEL": "DEBUG", "TMAGUARD_RECORD_DIR": records}
    run = run_python(pods(kind, **GPUS[gpu]), ACTIVATE, env)
    (line,) = run.guard_lines()  # run_python has checked the length of every guard line already
    assert len(line) <= GUARD_LINE_LIMIT
    message = line.split("] ", 1)[1]
    if kind == "nogpu":
        assert message.startswith("tmaguard: no GPU and no libcuda.so.1")
        return
    where = re.search(r"; details: (\S+)$", message)
    assert where, message
    record = json.loads(Path(where.group(1)).read_text())
    assert record["pid"] == int(line.split()[1].removeprefix("pid=").rstrip(")"))
    assert message.startswith(f"tmaguard: {record['summary'].split('; ')[0]}")
    assert "…" not in message.split("PROBLEM")[0]  # only a long problem is cut, and only where it is too long
    assert re.search(r"; routing: [^;…]+; details: ", message) or record["routing"] is None
    loaded = [a for a in record["actions"] if a.startswith(("loaded", "would load"))]
    if any("overlay" in a for a in loaded):
        assert "overlay loaded" in message or "would load the overlay" in message
    elif loaded:
        assert "shims loaded (" in message
    if record["unfixed"]:
        assert re.search(r"; PROBLEM( \(\d+\))?: " + re.escape(record["unfixed"][0][:10]), message)
