"""The guard never widens access (docs/SECURITY.md): it loads code only from paths that nobody but
root and this user can change, keeps its runtime files in a directory that is this user's alone, lets no
toggle point it at a file to load, and keeps the environment's secrets out of what it prints and writes.

Tests that need a file owned by another user chown it to `nobody` and run only as root; the mode-based
ones run as any user."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from faultkit import (
    GUARD_EFFECTS,
    GUARD_ONLY,
    NO_EFFECTS,
    RESOLVE,
    UNDEFINED,
    Child,
    collect_all,
    default_record_dir_at,
    run_modes,
)
from podkit import build_pod, scrubbed_environ

from vllm_tmaguard import files, redaction
from vllm_tmaguard.stages import trust
from vllm_tmaguard.stages.overlay import overlay_image
from vllm_tmaguard.stages.toggles import TOGGLES

NOBODY = 65534


def as_root(test):  # type: ignore[no-untyped-def]
    """Tests that chown files to another user: they need root (CI runs as root) and fail loudly without."""

    @functools.wraps(test)
    def run(*args, **kwargs):  # type: ignore[no-untyped-def]
        assert os.geteuid() == 0, "this test chowns files to another user: run the suite as root"
        return test(*args, **kwargs)

    return run


GUARD_DIR = Path(files.__file__).parent  # the installed package


def _mapped(stdout: str) -> list[str]:
    return json.loads(stdout.split("MAPPED ", 1)[1].splitlines()[0])


# Prints every mapped file whose path mentions libcuda or tmaguard, after vLLM's platform import.
PRINT_MAPS = (
    "\nimport json\nmaps = open('/proc/self/maps').read().splitlines()"
    "\nprint('MAPPED ' + json.dumps(sorted({l.split(None, 5)[-1] for l in maps"
    " if len(l.split()) == 6 and ('libcuda' in l or 'tmaguard' in l or 'memfd:' in l)})))"
)
RESOLVE_AND_MAPS = RESOLVE + PRINT_MAPS
# The same after the guard alone (its activation as vLLM's import hook runs it): what it loaded.
GUARD_AND_MAPS = GUARD_ONLY + PRINT_MAPS


# ---------------------------------------------------------------------------------------------------------
# Path trust, in-process


def test_trusted_paths(tmp_path: Path) -> None:
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o755)
    library = safe / "lib.so"
    library.write_bytes(b"x")
    library.chmod(0o755)
    assert files.path_problem(str(library)) is None
    assert trust.trusted_file(str(library)) == str(library.resolve())

    library.chmod(0o775)
    assert "lib.so is writable by group 0 (mode 0775), which this package's own code is not" in (
        files.path_problem(str(library))
    )
    library.chmod(0o755)
    safe.chmod(0o777)
    assert f"{safe} is writable by group 0 (mode 0777)" in files.path_problem(str(library))
    safe.chmod(0o1777)  # a sticky directory, like /tmp: nobody else can replace what is in it
    assert files.path_problem(str(library)) is None
    safe.chmod(0o755)

    link = tmp_path / "link.so"
    link.symlink_to(library)
    assert trust.trusted_file(str(link)) == str(library.resolve())  # the real path is what gets loaded
    with pytest.raises(trust.UntrustedPath, match="writable by group 0"):
        library.chmod(0o777)
        trust.trusted_file(str(link))
    with pytest.raises(FileNotFoundError):
        trust.trusted_file(str(tmp_path / "missing.so"))


@as_root
def test_paths_owned_by_another_user_are_not_trusted(tmp_path: Path) -> None:
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o755)
    library = directory / "lib.so"
    library.write_bytes(b"x")
    os.chown(library, NOBODY, NOBODY)
    assert f"lib.so is owned by uid {NOBODY} (neither root nor this user)" in files.path_problem(str(library))
    os.chown(library, 0, 0)
    os.chown(directory, NOBODY, NOBODY)
    assert f"{directory} is owned by uid {NOBODY}" in files.path_problem(str(library))
    # A link that someone else planted in a sticky directory (/tmp) to a file of ours is theirs.
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    os.chown(directory, 0, 0)
    planted = sticky / "lib.so"
    planted.symlink_to(library)
    os.lchown(planted, NOBODY, NOBODY)
    assert f"{planted} is owned by uid {NOBODY}" in files.path_problem(str(planted))


def test_private_directories_are_created_0700_with_their_parents(tmp_path: Path) -> None:
    previous = os.umask(0)  # even with a permissive umask
    try:
        real, problem = trust.private_dir(str(tmp_path / "a" / "b" / "records"))
    finally:
        os.umask(previous)
    assert problem is None and real == str(tmp_path / "a" / "b" / "records")
    for directory in ("a", "a/b", "a/b/records"):
        assert stat.S_IMODE((tmp_path / directory).stat().st_mode) == 0o700
    assert trust.private_dir("relative/records") == (None, "'relative/records' is not an absolute path")


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o777, 0o1777])
def test_an_existing_directory_that_is_not_private_is_refused(tmp_path: Path, mode: int) -> None:
    directory = tmp_path / "records"
    directory.mkdir()
    directory.chmod(mode)
    real, problem = trust.private_dir(str(directory))
    who = "its group" if mode == 0o750 else "everyone"
    assert real is None and problem == (
        f"{directory} has mode {mode:04o}: {who} can enter it; it must be 0700 (this user's alone)"
    )
    assert stat.S_IMODE(directory.stat().st_mode) == mode  # refused, not repaired


@as_root
def test_an_existing_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "records"
    directory.mkdir(mode=0o700)
    os.chown(directory, NOBODY, NOBODY)
    real, problem = trust.private_dir(str(directory))
    assert real is None and problem == f"{directory} belongs to uid {NOBODY}, not to this user (uid 0)"


def test_a_file_where_the_record_directory_should_be_is_called_a_file(tmp_path: Path) -> None:
    plain = tmp_path / "records"
    plain.write_text("")
    assert trust.private_dir(str(plain)) == (None, f"{plain} is a regular file, not a directory")


# ---------------------------------------------------------------------------------------------------------
# The package's libraries and the overlay's file, end to end


def _guard_copy(base: Path) -> tuple[Path, Path]:
    top = base / "guard-copy"
    shutil.copytree(GUARD_DIR, top / "vllm_tmaguard", ignore=shutil.ignore_patterns("__pycache__"))
    return top, top / "vllm_tmaguard" / "lib"


@pytest.mark.parametrize("weakness", ["world-writable directory", "group-writable file", "other owner"])
def test_untrusted_package_libraries_are_refused(off_reference, tmp_path: Path, weakness: str) -> None:
    """The package's libraries where someone else could have replaced them: the guard loads none of them,
    and vLLM behaves exactly as without the guard; the line says why. Strict mode stops with the cause."""
    assert weakness != "other owner" or os.geteuid() == 0, "chown to another user needs root"
    top, lib = _guard_copy(tmp_path)
    if weakness == "world-writable directory":
        lib.chmod(0o777)
        why = f"refused: {lib} is writable by group 0 (mode 0777)"
    elif weakness == "group-writable file":
        for library in lib.glob("*.so"):
            library.chmod(0o775)
        why = "libtmaguard_overlay.so is writable by group 0 (mode 0775)"
    else:
        for library in lib.glob("*.so"):
            os.chown(library, NOBODY, NOBODY)
        why = f"libtmaguard_overlay.so is owned by uid {NOBODY}"
    # The guard loads nothing: its run is the guard alone, which changes nothing vLLM would meet; the guard
    # off never meets its own libraries: the pod's reference run (faultkit.shared_reference).
    pod, off = off_reference("vcuda")
    runs = run_modes(pod, tmp_path / "runs", {"PYTHONPATH": str(top)}, guard_alone=True, off=off)
    assert runs["off"].outcome["error"].endswith(UNDEFINED)
    assert (runs["guard"].returncode, runs["guard"].outcome) == (0, NO_EFFECTS)
    line, problems = runs["guard"].line(), runs["guard"].last_record()["problems"]
    assert "PROBLEM (3): could not load the overlay: refused: " in line and "loaded" not in line
    assert [p["code"] for p in problems] == ["overlay-failed", "shim-failed", "shim-failed"]
    assert any(why in p["cause"] for p in problems), problems
    assert runs["strict"].returncode == 1 and why in runs["strict"].stderr


def _planted_overlay(records: Path, layer: Path) -> Path:
    """Where the guard would put its overlay for this layer, with something else already there."""
    digest = hashlib.sha256(overlay_image(str(layer))).hexdigest()[:16]
    planted = records / f"overlay-{digest}" / "libcuda.so.1"
    planted.parent.mkdir(parents=True)
    planted.write_bytes(layer.read_bytes())  # a real library: loading it would "work"
    return planted


@pytest.mark.parametrize("weakness", ["mode 0755", "mode 0777", "other owner"])
def test_a_record_directory_that_is_not_ours_alone_is_refused(pods, tmp_path: Path, weakness: str) -> None:
    """TMAGUARD_RECORD_DIR exists but someone else could write to it (or owns it), and a library waits at
    the exact path of the overlay's file. The guard writes nothing there and loads nothing from there: its
    files go to the default private directory, vLLM starts, the line names the refused directory and why."""
    assert weakness != "other owner" or os.geteuid() == 0, "chown to another user needs root"
    pod = pods("vcuda")
    records = tmp_path / "records"
    records.mkdir()
    planted = _planted_overlay(records, pod.lib_dir / "libcuda.so.1")
    if weakness == "other owner":
        records.chmod(0o700)
        for path in (records, planted.parent, planted):
            os.chown(path, NOBODY, NOBODY)
    else:
        records.chmod(0o755 if weakness == "mode 0755" else 0o777)
    before = sorted(p.name for p in records.iterdir())
    default = tmp_path / "default-records"  # the process's /tmp/tmaguard-<uid>
    default.mkdir(mode=0o700)
    prefix = default_record_dir_at(default)
    # What the guard loads and writes is decided in its activation: vLLM's start in the first case, the
    # guard alone in the others.
    starts_vllm = weakness == "mode 0755"
    code = RESOLVE_AND_MAPS if starts_vllm else GUARD_AND_MAPS
    run = Child(pod, code, tmp_path / "run", prefix=prefix, record_dir=records).collect(240)
    if starts_vllm:
        assert run.outcome == {"platform": "NvmlCudaPlatform"}
    line = run.line()
    pid = line.split("pid=", 1)[1].split(")", 1)[0]
    # The cause is clipped to fit the line; where the record went instead never is (the operator looks there).
    assert "overlay loaded;" in line and "PROBLEM: TMAGUARD_RECORD_DIR is refused: /tmp/" in line
    assert line.endswith(f"; record: /tmp/tmaguard-{os.getuid()}/process-{pid}.json")
    written = json.loads((default / f"process-{pid}.json").read_text())
    problem = written["problems"][0]
    assert problem["code"] == "record-dir-refused" and problem["subject"] == str(records)
    assert str(planted) not in _mapped(run.stdout)
    assert sorted(p.name for p in records.iterdir()) == before  # no last.json, no scan cache, no overlay


def test_a_stale_overlay_file_in_our_directory_is_replaced(pods, tmp_path: Path) -> None:
    """The overlay's file exists in our private directory but does not hold the overlay (an older build, a
    bad disk): the guard writes the right image in its place before loading it."""
    pod = pods("vcuda")
    records = tmp_path / "records"
    records.mkdir(mode=0o700)
    layer = pod.lib_dir / "libcuda.so.1"
    planted = _planted_overlay(records, layer)
    planted.parent.chmod(0o700)
    planted.chmod(0o500)
    run = Child(pod, RESOLVE_AND_MAPS, tmp_path / "run", record_dir=records).collect(240)
    assert run.outcome == {"platform": "NvmlCudaPlatform"}
    assert planted.read_bytes() == overlay_image(str(layer))
    assert str(planted) in _mapped(run.stdout) and "overlay loaded" in run.line()
    action = run.last_record()["actions"][0]
    assert action["kind"] == "load-overlay" and action["value"] == str(planted)


def test_a_layer_others_can_change_is_said_by_guard_doctor_and_env(pods, run_python, tmp_path) -> None:
    """Issue 34: the layer's directory on LD_LIBRARY_PATH is writable by others (a co-tenant could replace
    libcuda.so.1). The loader loads that file in every process whether or not the guard runs, so the guard
    changes nothing by standing its overlay in front of it, but it must say so; `tmaguard env` refused to
    install the overlay there (vLLM then fails as without it) while the guard loaded it silently. Now all
    three say the same thing, by its code: the guard's record (its overlay loaded), the doctor's finding,
    and `tmaguard env`, which installs the overlay and warns (exit 0)."""
    pod = pods("vcuda")
    pod.lib_dir.chmod(0o777)
    why = f"{pod.lib_dir} is writable by group 0 (mode 0777)"  # and by others: the first one is named
    run = run_python(pod, "from vllm_tmaguard.guard import activate\nactivate('test')")
    record = run.last_record()
    (problem,) = [p for p in record["problems"] if p["code"] == "layer-writable"]
    assert why in problem["cause"] and problem["subject"] == str(pod.lib_dir / "libcuda.so.1"), problem
    assert record["outcome"] == "supplied" and record["actions"][0]["kind"] == "load-overlay"
    assert record["actions"][0]["applied"] is True

    env = {**scrubbed_environ(), **pod.env}
    command = [sys.executable, "-m", "vllm_tmaguard"]
    doctor = subprocess.run(
        [*command, "doctor", "--json"], env=env, capture_output=True, text=True, timeout=300
    )
    (finding,) = [f for f in json.loads(doctor.stdout)["findings"] if f["id"] == "layer-writable"]
    assert finding["severity"] == "warning" and why in finding["detail"] and doctor.returncode == 1
    install = tmp_path / "install"
    done = subprocess.run(
        [*command, "env", "--install-dir", str(install)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"# installed {install}/libcuda.so.1" in done.stdout
    assert f"# warning: {problem['cause']}" in done.stdout, done.stdout
    assert done.stdout.splitlines()[-1] == f"export LD_LIBRARY_PATH={install}:{pod.lib_dir}"


def test_tmaguard_root_never_makes_the_guard_load_a_file(tmp_path: Path, standins) -> None:
    """TMAGUARD_ROOT points the probes at another tree. A libcuda.so.1 found there (its default
    directories), where this process's loader never looks, must not become the overlay's dependency:
    vLLM fails exactly as without the guard, and nothing under that root named libcuda is mapped."""
    pod = build_pod(tmp_path, "bare")
    hidden = pod.root / "lib64"
    hidden.mkdir()
    for name in ("libcuda.so.1", pod.real_driver.name):
        shutil.move(pod.lib_dir / name, hidden / name)  # only NVML stays on LD_LIBRARY_PATH
    # The guard loads nothing: its run is the guard alone, which changes nothing vLLM would meet (faultkit),
    # no libcuda.so.1 mapped included.
    children = {
        mode: Child(pod, code, tmp_path / mode, env)
        for mode, code, env in (
            ("off", RESOLVE_AND_MAPS, {"TMAGUARD_MODE": "off"}),
            ("guard", GUARD_EFFECTS + PRINT_MAPS, {}),
        )
    }
    runs = collect_all(children, 240)
    assert "libcuda.so.1: cannot open shared object file" in runs["off"].outcome["error"]
    assert (runs["guard"].returncode, runs["guard"].outcome) == (0, NO_EFFECTS)
    line, problems = runs["guard"].line(), runs["guard"].last_record()["problems"]
    refused = f"libcuda.so.1 ({hidden}/libcuda.so.1) was found under TMAGUARD_ROOT={pod.root}"
    assert f"PROBLEM: {refused[:40]}" in line and "fix: unset TMAGUARD_ROOT" in line
    assert [p["code"] for p in problems] == ["root-refused"] and problems[0]["cause"].startswith(refused)
    assert [m for m in _mapped(runs["guard"].stdout) if m.startswith(str(pod.root)) and "libcuda" in m] == []


# What each toggle can do to the files the guard loads or writes. A new toggle fails this test until it is
# added here, after a look at whether it lets an environment variable point the guard at code to load.
TOGGLE_AUDIT = {
    "TMAGUARD_MODE": "chooses whether anything is loaded; never what",
    "TMAGUARD_STRICT": "stops start-up; loads nothing",
    "TMAGUARD_GEMM": "routes vLLM's kernels through vLLM's own knobs; loads nothing",
    "TMAGUARD_OVERLAY": "chooses the overlay or the shims, both from the package's trusted directory",
    "TMAGUARD_MEMORY": "adds --gpu-memory-utilization to a vLLM server's own command line; loads nothing",
    "TMAGUARD_LOG_FORMAT": "formats the line",
    "TMAGUARD_TRACE": "prints each look-up the overlay and shims answer; loads nothing",
    "TMAGUARD_ROOT": "probes only: a libcuda.so.1 found under it is never loaded (guard.py, trust.py)",
    "TMAGUARD_RECORD_DIR": "where the overlay's file is written and loaded from: used only when it is this "
    "user's alone (0700, no one else can change its path), else the overlay stays in memory",
    "TMAGUARD_WHEEL_SHA256": "narrows which wheel the init container places from; never widens it (a wheel "
    "its RECORD does not vouch for stays refused)",
}


def test_every_toggle_is_audited() -> None:
    assert {spec.name for spec in TOGGLES} == set(TOGGLE_AUDIT)


# ---------------------------------------------------------------------------------------------------------
# Secrets


def test_redaction_rules() -> None:
    environ = {
        "HF_TOKEN": "hf_" + "a" * 34,
        "OPENAI_API_KEY": "sk-proj-0123456789abcdefghij",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "DB_PASSWORD": "correct horse battery",
        "MY_SIGNING_KEY": "k3y-value-123",
        "SOME_SETTING": "Bearer abcdefghijklmnop",  # any variable whose value is a bearer token
        "TOKENIZERS_PARALLELISM": "false-but-longer",  # not a credential
        "SHORT_TOKEN": "1",  # too short to look for
        "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
        "PWD": "/workspace/models",
    }
    assert redaction.secret_values(environ) == {
        environ[name]: name
        for name in (
            "HF_TOKEN",
            "OPENAI_API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "DB_PASSWORD",
            "MY_SIGNING_KEY",
            "SOME_SETTING",
        )
    }
    text = (
        f"path /pods/{environ['DB_PASSWORD']}/lib, key {environ['AWS_SECRET_ACCESS_KEY']}, "
        "proxy http://alice:s3cret@proxy:3128, "
        "header Authorization: Bearer eyJhbGciOiJI.eyJzdWIiOiIx.c2lnbmF0dXJl, "
        "github ghp_0123456789abcdefghijABCDEFGHIJ, aws AKIAIOSFODNN7EXAMPLE, model /workspace/models"
    )
    redacted = redaction.redact({"list": [text], "n": 3, "none": None}, environ)
    out = redacted["list"][0]
    for secret in (
        "correct horse battery",
        "wJalrXUtnFEMI",
        "s3cret",
        "eyJhbGciOiJI",
        "ghp_0123",
        "AKIAIOSFODNN7",
    ):
        assert secret not in out
    assert "<redacted $DB_PASSWORD>" in out and "<redacted $AWS_SECRET_ACCESS_KEY>" in out
    assert "proxy http://<redacted>@proxy:3128" in out
    assert "/workspace/models" in out and redacted["n"] == 3 and redacted["none"] is None


SECRET = "hf_" + "Zq9" * 12  # a Hugging Face token's shape


def _secret_env() -> dict[str, str]:
    return {
        "HF_TOKEN": SECRET,
        "OPENAI_API_KEY": "sk-" + "x1" * 16,
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "HTTPS_PROXY": "http://alice:pa55word@proxy.example:3128",
        "VLLM_TEST_PLAIN_SETTING": "plain-setting-value-42",  # not a secret: shows the env is not dumped
    }


def _assert_clean(text: str) -> None:
    for value in (SECRET, "x1x1x1x1", "wJalrXUtnFEMI", "pa55word", "plain-setting-value-42"):
        assert value not in text, f"{value!r} leaked"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_record_and_line_carry_no_secret(tmp_path: Path, standins, log_format: str) -> None:
    """A pod whose path contains the HF token's value (so the record quotes it), the usual credentials in
    the environment: the line and last.json show `<redacted $HF_TOKEN>` instead, and no other value of the
    environment appears (the record never includes the environment)."""
    pod = build_pod(tmp_path / SECRET, "vcuda")
    env = {**_secret_env(), "TMAGUARD_LOG_FORMAT": log_format}
    # vLLM's start (its own output checked too) in the text case; the JSON line's, the guard alone.
    run = Child(pod, RESOLVE if log_format == "text" else GUARD_ONLY, tmp_path / "run", env).collect(240)
    assert log_format != "text" or run.outcome == {"platform": "NvmlCudaPlatform"}
    line = run.line()
    written = (run.record_dir / "last.json").read_text()
    for text in (line, written, run.stderr):
        _assert_clean(text)
    assert "<redacted $HF_TOKEN>" in written
    assert log_format == "text" or "<redacted $HF_TOKEN>" in line  # the short text line quotes no pod path


def test_error_lines_carry_no_secret(tmp_path: Path) -> None:
    """A toggle set to a bearer token by mistake: the error line quotes the value, redacted."""
    code = "from vllm_tmaguard.guard import activate\nactivate('test')"
    env = {**scrubbed_environ(), "TMAGUARD_MODE": "Bearer abcdefghijklmnopqrstuvwxyz012345"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "TMAGUARD_MODE='<redacted" in done.stdout and "is not valid" in done.stdout
    assert "abcdefghijklmnop" not in done.stdout + done.stderr


def test_doctor_output_carries_no_secret(tmp_path: Path, standins) -> None:
    pod = build_pod(tmp_path / SECRET, "vcuda")
    env = {**scrubbed_environ(), **pod.env, **_secret_env(), "TMAGUARD_RECORD_DIR": str(tmp_path / "records")}
    env["COLUMNS"] = "1000"  # no folding: a folded secret would slip past the check
    for args in (["--json"], []):
        done = subprocess.run(
            [sys.executable, "-m", "vllm_tmaguard", "doctor", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert "Traceback" not in done.stderr
        _assert_clean(done.stdout + done.stderr)
        assert "<redacted $HF_TOKEN>" in done.stdout
