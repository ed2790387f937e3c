"""The record directory under attack (issue 25, items 1 and 15): a co-tenant (uid M) who made the victim's
(uid V) default record directory /tmp/tmaguard-<V> first, world-writable, with `doctor.json` a link to a
file of the victim's and a healthy-looking `last.json` of its own. Everything that writes or reads there
(the guard, `tmaguard doctor`, `tmaguard record`, the shipped preflight) judges the directory as the guard
does: nothing written into it or through its links, nothing read from it as the victim's, the refusal said
with its reason, and where the victim's record went instead."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from advkit_a import (
    MARKER,
    TMAGUARD,
    fake_vllm,
    fallback_dir,
    fresh_uids,
    own,
    planted,
    pod_env,
    pod_in,
    preflight_script,
    real_record,
    run_as,
    snapshot,
    user_bin,
    world_base,
)
from podkit import Pod, guard_lines

from vllm_tmaguard.codes import RECORD_DIR_REFUSED

VICTIM_DATA = b"the victim's own file: nobody else may change it\n"


class Squat:
    """The scene: a vCUDA pod, the victim V, the co-tenant M and M's squatted /tmp/tmaguard-<V>."""

    def __init__(self, base: Path, pod: Pod, victim: int, attacker: int, record: dict[str, Any]) -> None:
        self.base, self.pod, self.victim, self.attacker = base, pod, victim, attacker
        home = base / "victim-home"
        home.mkdir()
        own(home, victim, 0o700)
        self.precious = home / "precious"
        self.precious.write_bytes(VICTIM_DATA)
        own(self.precious, victim, 0o600)
        # The records emptyDir as kubelet makes it without fsGroup: root's, 0777. Refused for V (not V's).
        self.records = base / "records"
        self.records.mkdir()
        self.records.chmod(0o777)
        # M got there first: /tmp/tmaguard-<V>, M's, 0777, with a link and a record of M's own.
        self.squatted = fallback_dir(victim)
        self.squatted.mkdir()
        own(self.squatted, attacker, 0o777)
        for name in ("doctor.json", "process-1.json.tmp", "verdicts.json"):
            (self.squatted / name).symlink_to(self.precious)
            own(self.squatted / name, attacker)
        for name in ("last.json", "process-1.json"):
            (self.squatted / name).write_bytes(planted(record))
            own(self.squatted / name, attacker, 0o666)
        self.before = snapshot(self.squatted)

    def env(self, **extra: str) -> dict[str, str]:
        return pod_env(self.pod, self.base, **extra)

    def tmaguard(self, *args: str, **extra: str) -> Any:
        return run_as(self.victim, [*TMAGUARD, *args], self.env(**extra), self.base)

    def assert_untouched(self, output: str) -> None:
        """The victim's file as it was, M's directory as M left it, M's record never shown as V's."""
        assert self.precious.read_bytes() == VICTIM_DATA, "the victim's file was written through M's link"
        assert snapshot(self.squatted) == self.before, "something was written into the co-tenant's directory"
        assert MARKER not in output, f"the co-tenant's planted record was shown as the victim's:\n{output}"

    def assert_refusal_said(self, output: str) -> None:
        """The output names the squatted directory and why it is refused (M's, not V's)."""
        assert str(self.squatted) in output and f"belongs to uid {self.attacker}" in output, output


@pytest.fixture(scope="module")
def scene_parts() -> Iterator[tuple[Path, Pod, dict[str, Any]]]:
    with world_base("tmaguard-adv-a-records-") as base:
        pod = pod_in(base, "vcuda", cc="9.0")
        yield base, pod, real_record(pod, base)


@pytest.fixture
def squat(scene_parts: tuple[Path, Pod, dict[str, Any]]) -> Iterator[Squat]:
    _, pod, record = scene_parts
    with fresh_uids(2) as (victim, attacker), world_base("tmaguard-adv-a-scene-") as scene:
        yield Squat(scene, pod, victim, attacker, record)


@pytest.mark.parametrize("strict", ["0", "1"])
def test_the_real_preflight_as_the_victim_leaves_the_squatted_directory_alone(
    squat: Squat, strict: str
) -> None:
    """Item 1: the shipped preflight (rendered from deploy/k8s), run as the victim V whose records emptyDir is
    refused (root's, 0777), with the real `tmaguard` on an emulated vCUDA pod. M made V's fallback
    /tmp/tmaguard-<V> first (0777) with doctor.json linked to V's file and a healthy last.json. At 1cc570e
    the preflight wrote `tmaguard doctor --json > /tmp/tmaguard-<V>/doctor.json` through the link (V's file
    overwritten) and logged "doctor: healthy" from M's record. Now: V's file and M's directory untouched, M's
    record never shown, the refusal said with its reason; vLLM still starts, or with TMAGUARD_STRICT=1 the
    container stops with the refusal as its termination message."""
    bin_dir = fake_vllm(squat.base)
    termination = squat.base / "termination-log"
    termination.write_bytes(b"")
    own(termination, squat.victim, 0o644)
    env = squat.env(
        PATH=f"{bin_dir}:{user_bin(squat.base, squat.victim)}:/usr/bin:/bin",
        TMAGUARD_RECORD_DIR=str(squat.records),
        TMAGUARD_STRICT=strict,
        PREFLIGHT_TERMINATION_LOG=str(termination),
    )
    command = ["/bin/sh", str(preflight_script(squat.base)), "m", "--port=8000"]
    done = run_as(squat.victim, command, env, squat.base, timeout=120)
    output = done.stdout + done.stderr
    squat.assert_untouched(output + termination.read_text())
    assert "doctor: healthy" not in done.stderr, done.stderr
    squat.assert_refusal_said(done.stderr)
    assert "report not saved" in done.stderr, done.stderr  # where the report went: nowhere, and why
    if strict == "0":
        assert done.returncode == 0 and "VLLM RAN serve m --port=8000" in done.stdout, output
        assert termination.read_text() == ""
    else:
        assert done.returncode == 1 and "VLLM RAN" not in done.stdout, output
        squat.assert_refusal_said(termination.read_text())


@pytest.mark.parametrize("asked", ["default", "refused emptyDir"])
def test_doctor_as_the_victim_refuses_the_squatted_directory(squat: Squat, asked: str) -> None:
    """Item 1: `tmaguard doctor` as V, with TMAGUARD_RECORD_DIR unset (its default is M's squatted directory)
    or set to a refused emptyDir (the doctor then looks in the fallback, M's). At 1cc570e the doctor read
    M's last.json as V's record and reported it. Now it reads nothing there, says the directory is refused
    and why, and `--save` writes nothing into it (nor through its doctor.json link)."""
    extra = {} if asked == "default" else {"TMAGUARD_RECORD_DIR": str(squat.records)}
    done = squat.tmaguard("doctor", "--json", **extra)
    squat.assert_untouched(done.stdout + done.stderr)
    report = json.loads(done.stdout)
    assert report["record"]["found"] is False and report["record"]["record"] is None, report["record"]
    refused = [f for f in report["findings"] if f["id"] == "record-dir-refused"]
    assert refused, report["findings"]
    asked_dir = str(squat.squatted if asked == "default" else squat.records)
    assert [f["subject"] for f in refused] == [asked_dir], refused  # by its fields, not its sentence
    squat.assert_refusal_said(json.dumps(refused))
    assert done.returncode == 1, done.stderr  # a finding, not healthy

    saved = squat.tmaguard("doctor", "--json", "--save", **extra)
    squat.assert_untouched(saved.stdout + saved.stderr)
    report = json.loads(saved.stdout)
    assert report["saved"]["path"] is None, report["saved"]
    squat.assert_refusal_said(report["saved"]["error"])
    text = squat.tmaguard("doctor", **extra)
    squat.assert_untouched(text.stdout + text.stderr)
    squat.assert_refusal_said(" ".join(text.stdout.split()))


@pytest.mark.parametrize("asked", ["default", "refused emptyDir"])
def test_record_as_the_victim_never_prints_the_planted_record(squat: Squat, asked: str) -> None:
    """Item 1: `tmaguard record` as V. At 1cc570e it opened TMAGUARD_RECORD_DIR/last.json with a plain open
    (M's record printed as V's, exit 0) and skipped the guard's fallback. Now: exit status 1, nothing
    printed as a record, the refusal and its reason on stderr, nothing written."""
    extra = {} if asked == "default" else {"TMAGUARD_RECORD_DIR": str(squat.records)}
    done = squat.tmaguard("record", **extra)
    squat.assert_untouched(done.stdout + done.stderr)
    assert done.returncode == 1 and done.stdout == "", done.stdout
    squat.assert_refusal_said(done.stderr)


GUARD = (
    "import json, os\n"
    "from vllm_tmaguard.guard import activate\n"
    "record = activate('adversarial')\n"
    "problems = [[p['code'], p.get('subject')] for p in record['problems']]\n"
    "print('RESULT ' + json.dumps({'pid': os.getpid(), 'record_file': record['record_file'], "
    "'problems': problems}))\n"
)


def test_the_guard_as_the_victim_writes_nothing_into_the_squatted_directory(squat: Squat) -> None:
    """Items 1 and 15: the guard itself in a vLLM process of V, with the records emptyDir refused and the
    fallback M's. Nothing written there or through its links; the line says that no record was written and
    why the fallback was refused (at 1cc570e it gave cause and fix, not where the record went)."""
    done = run_as(squat.victim, [sys.executable, "-c", GUARD],
                  squat.env(TMAGUARD_RECORD_DIR=str(squat.records)), squat.base, timeout=120)  # fmt: skip
    squat.assert_untouched(done.stdout + done.stderr)
    assert done.returncode == 0, done.stderr
    (line,) = guard_lines(done.stdout)
    assert "record: none written" in line, line
    assert f"{squat.records}" in line, line
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["record_file"] is None  # by the record's fields too, not the line's sentence alone
    assert [RECORD_DIR_REFUSED, str(squat.records)] in result["problems"], result["problems"]


def test_a_refused_record_dir_line_names_where_the_record_went(scene_parts) -> None:  # type: ignore[no-untyped-def]
    """Item 15: V's records emptyDir is refused (root's, 0777); the guard falls back to /tmp/tmaguard-<V>
    (fresh). At 1cc570e the line gave the refusal's cause and fix but not where the record went. Now it says
    "record: /tmp/tmaguard-<V>/process-<pid>.json", that file is the record, and `tmaguard doctor` and
    `tmaguard record` (same settings) find it there."""
    _, pod, _ = scene_parts
    with fresh_uids(1) as (victim,), world_base("tmaguard-adv-a-moved-") as scene:
        records = scene / "records"
        records.mkdir()
        records.chmod(0o777)
        env = pod_env(pod, scene, TMAGUARD_RECORD_DIR=str(records))
        done = run_as(victim, [sys.executable, "-c", GUARD], env, scene, timeout=120)
        assert done.returncode == 0, done.stderr
        pid = json.loads(done.stdout.split("RESULT ", 1)[1])["pid"]
        written = fallback_dir(victim) / f"process-{pid}.json"
        (line,) = guard_lines(done.stdout)
        assert f"record: {written}" in line, line
        assert json.loads(written.read_text())["pid"] == pid
        problems = json.loads(written.read_text())["problems"]
        assert [(p["code"], p["subject"]) for p in problems] == [(RECORD_DIR_REFUSED, str(records))], problems
        assert os.listdir(records) == []

        doctor = run_as(victim, [*TMAGUARD, "doctor", "--json"], env, scene)
        report = json.loads(doctor.stdout)["record"]
        assert report["found"] and report["record"]["pid"] == pid, report
        assert report["path"] == str(fallback_dir(victim) / "last.json"), report
        shown = run_as(victim, [*TMAGUARD, "record"], env, scene)
        assert shown.returncode == 0 and json.loads(shown.stdout)["pid"] == pid, shown.stderr
