"""What an operator and the preflight read from `tmaguard`: exit statuses that say one thing each (0 healthy
or done, 1 findings, 2 usage, 3 the command itself failed: vllm_tmaguard/codes.py, docs/doctor.md), the
real preflight acting on the real doctor's status (item 9), a stop that names the setting that asked for it
(item 14), and `tmaguard record` printing only a record (item 16). The faults are real: a package install
cut short, a standard output that is full or closed, files in the record directory as a crash or another
program leaves them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from advkit_c import document_of, guard_environ, read_record, run_guard, tmaguard
from faultkit import RESOLVE, Result
from podkit import as_kubelet_container

REPO = Path(__file__).resolve().parents[2]
PREFLIGHT = REPO / "deploy/k8s/base/tmaguard-preflight.yaml"
GUARD_DIR = Path(__import__("vllm_tmaguard").__file__).parent
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3  # as docs/doctor.md documents them


@pytest.fixture
def damaged_install(tmp_path: Path) -> Path:
    """A copy of the installed package whose preview.py was cut in half (an upgrade interrupted mid-copy,
    a layer of the image truncated): a real fault of the doctor's own code, hit only once it gathers. Put
    its directory first on PYTHONPATH."""
    site = tmp_path / "damaged-site"
    shutil.copytree(GUARD_DIR, site / "vllm_tmaguard", ignore=shutil.ignore_patterns("__pycache__"))
    preview = site / "vllm_tmaguard/stages/preview.py"
    text = preview.read_text()
    preview.write_text(text[: len(text) // 2])
    return site


def test_doctor_internal_error_is_exit_3_with_a_json_report(pods, damaged_install, tmp_path) -> None:
    """Item 9 (exit statuses): the doctor failing itself exited 1, the status of findings, and printed no
    JSON with --json (the preflight then saved an empty report). Now: exit 3, one line on stderr, and with
    --json a JSON document whose status is "internal-error"."""
    pod = pods("vcuda")
    env = guard_environ(pod, tmp_path / "records", {"PYTHONPATH": str(damaged_install)})
    done = tmaguard("doctor", "--json", env=env, cwd=tmp_path)
    assert done.returncode == EXIT_INTERNAL, (done.returncode, done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert report["status"] == "internal-error" and report["exit_code"] == EXIT_INTERNAL, report
    assert report["schema"] == "tmaguard.doctor/2"
    (line,) = done.stderr.splitlines()
    assert line.startswith("tmaguard doctor: internal error: ") and line == report["error"], done.stderr

    done = tmaguard("doctor", env=env, cwd=tmp_path)
    assert done.returncode == EXIT_INTERNAL and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("tmaguard doctor: internal error: ")


@pytest.mark.parametrize("output", ["full", "closed"])
def test_an_output_that_fails_is_exit_3(pods, tmp_path, output: str) -> None:
    """Item 9 (exit statuses): standard output full (/dev/full) or closed, as a log collector that died
    leaves it. The doctor with --json printed a traceback and exited 1 (findings) or 120; `tmaguard
    record`, `check` and `env` with a closed output exited 0 having printed nothing. Now every command exits
    3 with one line on stderr."""
    pod = pods("vcuda")
    records = tmp_path / "records"
    assert run_guard(pod, records).returncode == 0  # a record for `tmaguard record` to print
    env = guard_environ(pod, records)
    for args in (["doctor", "--json"], ["doctor"], ["record"], ["check"], ["env"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run(
                [sys.executable, "-m", "vllm_tmaguard", *args],
                env=env,
                stdout=full if output == "full" else None,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                cwd=tmp_path,
                preexec_fn=None if output == "full" else _close_stdout,
            )
        assert done.returncode == EXIT_INTERNAL, (args, done.returncode, done.stderr)
        (line,) = done.stderr.splitlines()
        assert "internal error: OSError" in line, (args, done.stderr)


def _close_stdout() -> None:
    os.close(1)


def test_usage_errors_are_exit_2(tmp_path) -> None:
    """Item 9 (exit statuses): a command line the command cannot take is a usage error, exit 2, whichever
    command reads it (argparse for the doctor, click for the rest)."""
    env = {"PATH": "/usr/bin:/bin", "TMAGUARD_RECORD_DIR": str(tmp_path / "records")}
    for args in (
        [], ["no-such-command"], ["doctor", "--no-such-flag"], ["doctor", "--nvml-timeout", "soon"],
        ["record", "extra"], ["check", "--no-such-flag"], ["env", "--install-dir"], ["inject"],
    ):  # fmt: skip
        done = tmaguard(*args, env=env, cwd=tmp_path)
        assert done.returncode == EXIT_USAGE, (args, done.returncode, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr


def test_findings_are_exit_1_and_healthy_is_exit_0(pods, tmp_path) -> None:
    """Item 9 (exit statuses): on one vCUDA pod, the doctor exits 0 where the guard supplies what the layer
    lacks (healthy), 1 where the guard is off (findings); `check` 0 for what the guard does here, 1 for a
    demand it cannot meet (a warning); `record` 1 before any record, 0 after."""
    pod = pods("vcuda")
    records = tmp_path / "records"
    env = guard_environ(pod, records)
    off = guard_environ(pod, records, {"TMAGUARD_MODE": "off"})
    hopper = guard_environ(pod, records, {"TMAGUARD_GEMM": "hopper"})
    done = tmaguard("record", env=env, cwd=tmp_path)
    assert done.returncode == EXIT_FINDINGS and "no record" in done.stderr, done.stderr
    assert run_guard(pod, records).returncode == 0
    expected = [
        (("doctor", "--json"), env, EXIT_OK), (("doctor", "--json"), off, EXIT_FINDINGS),
        (("check",), env, EXIT_OK), (("check",), hopper, EXIT_FINDINGS), (("record",), env, EXIT_OK),
    ]  # fmt: skip
    for args, environ, status in expected:
        done = tmaguard(*args, env=environ, cwd=tmp_path)
        assert done.returncode == status, (args, done.stdout, done.stderr)
        if args[0] == "doctor":
            report = json.loads(done.stdout)
            assert report["exit_code"] == status
            assert report["status"] == ("healthy" if status == EXIT_OK else "problems"), report["status"]


def _preflight(tmp_path: Path) -> Path:
    """The shipped preflight script (base kustomization's ConfigMap), as the container runs it."""
    config = yaml.safe_load(PREFLIGHT.read_text())
    script = tmp_path / "preflight.sh"
    script.write_text(config["data"]["preflight.sh"])
    return script


def _run_preflight(
    script: Path, env: dict[str, str], tmp_path: Path
) -> tuple[int, list[str] | None, str, str]:
    """(exit status, `vllm serve`'s arguments if it was started, stderr, termination message)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "vllm").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$VLLM_ARGS"\n')
    (bin_dir / "vllm").chmod(0o755)
    termination = tmp_path / "termination-log"
    termination.write_text("")  # the kubelet's file: appended to, never created
    started = tmp_path / "vllm.args"
    started.unlink(missing_ok=True)
    done = subprocess.run(
        ["/bin/sh", str(script), "Qwen/x"],
        env={
            **env,
            "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "VLLM_ARGS": str(started),
            "PREFLIGHT_TERMINATION_LOG": str(termination),
        },
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    args = started.read_text().splitlines() if started.exists() else None
    return done.returncode, args, done.stderr, termination.read_text()


def test_the_real_preflight_acts_on_the_real_doctors_status(pods, damaged_install, tmp_path) -> None:
    """Item 9 (the preflight distinguishes the statuses): the shipped preflight with the real `tmaguard` on
    an emulated vCUDA pod. Findings (the guard off): logged as the doctor's error and its fix, vLLM starts;
    strict mode stops with them as the termination message. The doctor failing itself (a damaged install):
    said to be the doctor's failure, never a diagnosis, vLLM starts; strict mode stops saying so. The
    stand-in doctor of tests/deploy shows the dispatch; here the real doctor's statuses drive it."""
    pod = pods("vcuda")
    script = _preflight(tmp_path)
    base = guard_environ(pod, tmp_path / "records")

    status, started, stderr, termination = _run_preflight(script, {**base, "TMAGUARD_MODE": "off"}, tmp_path)
    assert (status, started, termination) == (0, ["serve", "Qwen/x"], ""), stderr
    assert "tmaguard preflight: doctor: error: cuGetProcAddress_v2: missing from libcuda.so.1" in stderr
    assert "Fix: " in stderr and "doctor: healthy" not in stderr
    strict = {**base, "TMAGUARD_MODE": "off", "TMAGUARD_STRICT": "1"}
    status, started, stderr, termination = _run_preflight(script, strict, tmp_path)
    assert (status, started) == (1, None), stderr
    assert termination.startswith("tmaguard preflight (TMAGUARD_STRICT=1) stopped start-up: doctor: error: ")

    damaged = {**base, "PYTHONPATH": str(damaged_install)}
    status, started, stderr, termination = _run_preflight(script, damaged, tmp_path)
    assert (status, started, termination) == (0, ["serve", "Qwen/x"], ""), stderr
    assert "doctor could not run: it failed itself (exit 3, not a diagnosis): " in stderr, stderr
    assert "tmaguard doctor: internal error: " in stderr and "doctor: error" not in stderr
    status, started, stderr, termination = _run_preflight(
        script, {**damaged, "TMAGUARD_STRICT": "1"}, tmp_path
    )
    assert (status, started) == (1, None), stderr
    assert "it failed itself (exit 3, not a diagnosis): tmaguard doctor: internal error: " in termination

    status, started, stderr, termination = _run_preflight(script, base, tmp_path)
    assert (status, started, termination) == (0, ["serve", "Qwen/x"], ""), stderr
    assert f"doctor: healthy (report: {tmp_path}/records/doctor.json)" in stderr, stderr


def test_an_impossible_gemm_demand_names_itself_not_strict_mode(pods, tmp_path) -> None:
    """Item 14: TMAGUARD_GEMM=hopper on an sm_89 pod, TMAGUARD_STRICT unset (or 0): start-up stopped with
    "vllm-tmaguard (TMAGUARD_STRICT=1) stopped start-up", and the operator looked for a setting that is not
    there. Now the stop, on stderr and in the termination message, names TMAGUARD_GEMM=hopper and what it
    cannot have, and never TMAGUARD_STRICT."""
    pod = pods("vcuda", cc="8.9")
    for strict in ({}, {"TMAGUARD_STRICT": "0"}):
        termination = tmp_path / f"termination-{len(strict)}"
        termination.write_text("")
        env = guard_environ(pod, tmp_path / "records", {"TMAGUARD_GEMM": "hopper", **strict})
        done = subprocess.run(
            as_kubelet_container([sys.executable, "-c", RESOLVE], termination),
            env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path,
        )  # fmt: skip
        run = Result(done.returncode, done.stdout, done.stderr, tmp_path / "records")
        assert run.returncode == 1 and run.outcome is None, (done.stdout, done.stderr)
        stop = "vllm-tmaguard (TMAGUARD_GEMM=hopper) stopped start-up: TMAGUARD_GEMM=hopper insists on Hopper"
        assert stop in done.stderr and "TMA is unusable: no sm_90 GPU (8.9)" in done.stderr, done.stderr
        assert stop in termination.read_text()
        assert "TMAGUARD_STRICT" not in done.stderr + termination.read_text()
        assert "PROBLEM: TMAGUARD_GEMM=hopper" in run.line()


NOT_RECORDS = {
    "not JSON": b'{"schema": 2, "pid": ',
    "a list": b"[]",
    "a schema alone": b'{"schema": 2}',
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "binary": b"\x7fELF\x02\x01\x01\x00\xff\xfe",
}


def test_record_prints_only_a_record(pods, tmp_path) -> None:
    """Item 16: `tmaguard record` printed whatever last.json held (garbage, another program's JSON) with
    exit 0. Now: not a record, exit 1 and why on stderr, nothing on stdout; a record (the guard's own,
    written by a real run) exit 0 and that record."""
    pod = pods("vcuda")
    records = tmp_path / "records"
    document = document_of(run_guard(pod, records).stdout)
    assert document is not None
    last = records / "last.json"
    real = last.read_bytes()
    env = guard_environ(pod, records)

    done = tmaguard("record", env=env, cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stderr
    assert json.loads(done.stdout) == read_record(last) == json.loads(real)

    wrong_types = {**json.loads(real), "problems": "none", "pid": "1"}
    cases = {**NOT_RECORDS, "wrong types": json.dumps(wrong_types).encode()}
    for what, data in cases.items():
        last.unlink()
        last.write_bytes(data)
        last.chmod(0o600)
        done = tmaguard("record", env=env, cwd=tmp_path)
        assert done.returncode == EXIT_FINDINGS, (what, done.returncode, done.stdout[:200])
        assert done.stdout == "", what
        said = done.stderr.removeprefix(f"tmaguard record: {last}")  # the file, then why it is no record
        assert said != done.stderr and len(said.strip(" :\n")) > 10, (what, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, (what, done.stderr)
