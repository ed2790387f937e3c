"""The doctor's readable output (against a golden file), its command line, usage errors and help."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from doctorkit import GOLDEN, PRINTING, SITE
from podkit import child_environ, scrubbed_environ

from vllm_tmaguard.doctor.render import render_text


def _normalise(report: dict, replacements: dict[str, str]) -> dict:
    """Paths that differ from machine to machine replaced (longest first), timings fixed."""
    text = json.dumps(report)
    for path, name in sorted(replacements.items(), key=lambda item: -len(item[0])):
        text = text.replace(path, name)
    normalised = json.loads(text)
    normalised["elapsed_ms"] = 0.0
    return normalised


def test_readable_output_golden(pods, doctor, monkeypatch) -> None:
    """The readable report of the first scenario (vCUDA, RTX 4090). Rendered with render_text() from the JSON
    the command printed, after replacing machine-specific paths, so the wrapping is the same everywhere.
    Refresh after an intended change: TMAGUARD_UPDATE_GOLDEN=1 pytest tests/doctor -k golden"""
    pod = pods("vcuda")
    run = doctor(pod, "--json")
    replacements = {str(pod.root): "/pod", SITE: "/site-packages", str(run.record_dir): "/records"}
    for library in run.report["decision"]["layer_files"]:  # which build: this machine's compiler's
        replacements[f"{library['size']} bytes"] = "SIZE bytes"
        replacements[library["sha256"]] = "SHA256-12HEX"
        replacements[library["build_id"]] = "BUILD-ID"
        replacements.update(dict.fromkeys(library["versions"], "COMPILER"))
    report = _normalise(run.report, replacements)
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    render_text(report, file=out)
    text = "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"
    if os.environ.get("TMAGUARD_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_readable_output_of_the_command(pods, doctor) -> None:
    run = doctor(pods("vcuda"), env={"TMAGUARD_OVERLAY": "off"})
    assert run.returncode == 1 and run.stderr == ""
    lines = run.stdout.splitlines()
    assert lines[0].startswith("tmaguard doctor 0.1.0 (passive")
    for heading in ("Driver entry points by consumer", "GPU code in vLLM's extensions", "Findings", "Fix"):
        assert heading in lines
    assert any(line.startswith("ERROR") and "triton: libcuda.so.1 lacks" in line for line in lines)
    assert re.fullmatch(r"3 problems found \(exit 1\), [0-9.]+ ms", lines[-1].rstrip()), lines[-1]
    assert 'TMAGUARD_OVERLAY: "auto"' in run.stdout  # the line for the toggles' ConfigMap
    assert not [line for line in lines if line != line.rstrip()]  # no padding to the terminal's width


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_readable_output_on_a_stream_that_is_not_utf8(pods, tmp_path: Path, encoding: str) -> None:
    """Issue 34: a `kubectl exec` without a UTF-8 locale (here PYTHONIOENCODING) gave "internal error:
    UnicodeEncodeError" and exit 3. The report prints in the stream's encoding: tables drawn in ASCII, a
    character the encoding lacks (the record directory's name here) as a backslash escape, the exit status
    the diagnosis's."""
    records = tmp_path / "r\u00e9cords-\u20ac"
    env = child_environ(pods("vcuda"), records, {"TMAGUARD_OVERLAY": "off"}, PRINTING)
    done = subprocess.run(
        [sys.executable, "-m", "vllm_tmaguard", "doctor"],
        env={**env, "PYTHONIOENCODING": encoding},
        capture_output=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert (done.returncode, done.stderr) == (1, b""), done.stderr.decode(errors="replace")
    lines = done.stdout.decode(encoding).splitlines()  # strict: every byte is the encoding's
    for heading in ("Driver entry points by consumer", "GPU code in vLLM's extensions", "Findings", "Fix"):
        assert heading in lines
    assert any(set(line) == {"-", "+"} for line in lines)  # a table's rule, in ASCII
    shown = "r\\xe9cords-\\u20ac" if encoding == "ascii" else "r\u00e9cords-\\u20ac"
    assert shown in "".join(line.strip() for line in lines), lines  # however the line was folded
    assert re.fullmatch(r"3 problems found \(exit 1\), [0-9.]+ ms", lines[-1]), lines[-1]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--nvml-timeout", "0"], {}, "argument --nvml-timeout: 0 is too small"),
        (["--nvml-timeout", "soon"], {}, "'soon' is not a number of seconds"),
        (["--vllm-dir", "/nonexistent"], {}, "'/nonexistent' is not a directory"),
        (["--frobnicate"], {}, "unrecognized arguments: --frobnicate"),
    ],
)
def test_usage_errors_exit_2(pods, doctor, args: list[str], env: dict[str, str], message: str) -> None:
    run = doctor(pods("bare"), *args, env=env)
    assert run.returncode == 2 and run.stdout == "" and message in run.stderr


def test_a_bad_toggle_is_a_finding_and_the_rest_is_still_examined(pods, doctor) -> None:
    """The guard falls back to the toggle's default (it never drops the symbol fix for a typo): the doctor
    reports what the guard will do, and the typo as a problem with its fix."""
    run = doctor(pods("vcuda"), "--json", env={"TMAGUARD_MODE": "fix-it", "TMAGUARD_GEMM": "bogus"})
    assert run.returncode == 1
    titles = [f["title"] for f in run.report["findings"] if f["id"] == "toggle-invalid"]
    assert any("TMAGUARD_MODE='fix-it'" in title for title in titles), titles
    mode = next(f for f in run.report["findings"] if "TMAGUARD_MODE" in f["title"])
    assert "auto | validate | off" in mode["fix"]["text"]
    assert [s["library"] for s in run.report["guard"]["supplies"]] == ["overlay"]  # the fix still planned


def test_console_script_and_help(pods) -> None:
    script = Path(sys.executable).parent / "tmaguard"
    env = scrubbed_environ(PRINTING) | pods("bare").env
    done = subprocess.run(
        [str(script), "doctor", "--help"], env=env, capture_output=True, text=True, timeout=300
    )
    usage = " ".join(done.stdout.split())
    assert (
        done.returncode == 0
        and "Exit status: 0 healthy, 1 problems found (a bad TMAGUARD_* value, a damaged record file too), "
        "2 usage error, 3 the doctor itself failed (never a diagnosis)"
        in usage
    )
    done = subprocess.run(
        [str(script), "doctor", "--json"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and json.loads(done.stdout)["schema"] == "tmaguard.doctor/2"
    listed = subprocess.run(
        [str(script), "--help"], env=env, capture_output=True, text=True, timeout=300
    ).stdout
    assert "doctor" in listed and "check" in listed
