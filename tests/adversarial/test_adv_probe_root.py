"""TMAGUARD_ROOT is for the probes alone (issue 25, items 2 and 3): it points the file probes at another tree
(tests, a pod's files seen from outside), and nothing is written, linked or loaded through it. The attacks:
a libcuda.so.1 planted under TMAGUARD_ROOT (its constructor leaves a marker: the proof it ran) that
`tmaguard env --install-dir` would make the overlay's DT_NEEDED, and a TMAGUARD_ROOT/dev/termination-log
linked to a file of the attacker's choice that strict mode's stop would append to. The termination message
goes to the container's real /dev/termination-log (podkit.as_kubelet_container), never through a link."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from advkit_a import (
    TMAGUARD,
    as_user,
    fresh_uids,
    own,
    planted_libcuda,
    pod_env,
    pod_in,
    with_linked_termination_log,
    world_base,
)
from podkit import as_kubelet_container, scrubbed_environ

LOAD_LIBCUDA = (
    "import ctypes\n"
    "try:\n"
    "    ctypes.CDLL('libcuda.so.1')\n"
    "except OSError as error:\n"
    "    print('no libcuda.so.1:', error)\n"
)
ACTIVATE = "from vllm_tmaguard.guard import activate; activate('adversarial')"


def _run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_env_never_installs_an_overlay_of_a_libcuda_found_only_under_tmaguard_root(tmp_path: Path) -> None:
    """Item 2: `TMAGUARD_ROOT=R tmaguard env --install-dir D` where the only libcuda.so.1 is R/lib64's (a
    stand-in whose constructor writes a marker). At 1cc570e it wrote D/libcuda.so.1, an overlay whose
    DT_NEEDED is R/lib64/libcuda.so.1, with no trust check: every process that then loads libcuda.so.1 from
    D ran the planted file. Now: exit status 1, the refusal names R, nothing in D, and neither `env`, a
    process loading libcuda.so.1 with D first on its library path, nor the guard itself ever loads it."""
    root, marker, install = tmp_path / "root", tmp_path / "marker", tmp_path / "overlay"
    planted_libcuda(root / "lib64/libcuda.so.1", marker)
    env = {**scrubbed_environ(), "TMAGUARD_ROOT": str(root)}
    done = _run([*TMAGUARD, "env", "--install-dir", str(install)], env, tmp_path)
    assert not marker.exists(), "tmaguard env loaded the planted libcuda.so.1"
    # What the preflight does next: every process finds D first on its library path.
    loader_env = {**scrubbed_environ(), "LD_LIBRARY_PATH": str(install)}
    loaded = _run([sys.executable, "-c", LOAD_LIBCUDA], loader_env, tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    assert not marker.exists(), (
        "a process loading libcuda.so.1 from the install directory ran the planted file"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "refused" in done.stdout and f"TMAGUARD_ROOT={root}" in done.stdout, done.stdout
    assert not install.exists() or os.listdir(install) == [], os.listdir(install)
    guard = _run(
        [sys.executable, "-c", ACTIVATE], {**env, "TMAGUARD_RECORD_DIR": str(tmp_path / "rec")}, tmp_path
    )
    assert guard.returncode == 0, guard.stderr
    assert not marker.exists(), "the guard loaded a libcuda.so.1 found only under TMAGUARD_ROOT"


def test_env_warns_of_a_libcuda_others_can_replace(tmp_path: Path) -> None:
    """Item 2 (the trust check of that file): the libcuda.so.1 this process's loader finds
    (LD_LIBRARY_PATH) sits in a world-writable directory: anyone could replace it. At 1cc570e `tmaguard env
    --install-dir` installed the overlay in front of it saying nothing. After issue 25 it refused (exit 1),
    while the guard in a process loaded the overlay in front of the same file silently; but the loader loads
    that file into every process whatever either does, so refusing protected nothing and left vLLM failing.
    Since issue 34 both say it the same way (layer-writable, docs/SECURITY.md): env installs the overlay,
    warns with the file and why (exit 0), and never loads the file itself."""
    libs, marker, install = tmp_path / "libs", tmp_path / "marker", tmp_path / "overlay"
    planted_libcuda(libs / "libcuda.so.1", marker)
    libs.chmod(0o777)
    env = {**scrubbed_environ(), "LD_LIBRARY_PATH": str(libs)}
    done = _run([*TMAGUARD, "env", "--install-dir", str(install)], env, tmp_path)
    assert not marker.exists(), "tmaguard env loaded the libcuda.so.1 others can replace"
    assert done.returncode == 0, done.stdout + done.stderr
    warning = f"# warning: libcuda.so.1 ({libs / 'libcuda.so.1'}) is loaded from where others can change it: "
    assert warning + f"{libs} is writable by" in done.stdout, done.stdout
    assert os.listdir(install) == ["libcuda.so.1"] and done.stdout.endswith(f"={install}:{libs}\n")


VICTIM_DATA = b"a file the attacker wants the stop message appended to\n"


@pytest.fixture
def strict_scene() -> Iterator[tuple[Path, int]]:
    """A world-traversable base and a fresh uid V whose record directory is refused (root's, 0777) in
    strict mode: the guard stops start-up."""
    with world_base("tmaguard-adv-a-root-") as base, fresh_uids(1) as (victim,):
        records = base / "records"
        records.mkdir()
        records.chmod(0o777)
        target = base / "victim-file"
        target.write_bytes(VICTIM_DATA)
        own(target, victim, 0o644)  # V could write it: only the guard's own care keeps it unchanged
        yield base, victim


def test_strict_stop_never_writes_through_a_termination_log_link_under_tmaguard_root(strict_scene) -> None:  # type: ignore[no-untyped-def]
    """Item 3: strict mode (TMAGUARD_STRICT=1, the record directory refused) with TMAGUARD_ROOT=R, where
    R/dev/termination-log is a link (planted by another uid) to a file V can write. At 1cc570e the stop was
    appended to R/dev/termination-log, through the link, and never reached the container's own file. Now:
    that file unchanged, the stop in the real /dev/termination-log (the kubelet's, in a private mount
    namespace), start-up stopped."""
    base, victim = strict_scene
    pod = pod_in(base, "vcuda", cc="9.0")
    with fresh_uids(1) as (attacker,):
        link = pod.root / "dev/termination-log"
        link.symlink_to(base / "victim-file")
        own(link, attacker)
    kubelet = base / "termination-log"  # the kubelet's file: exists, the container user's, empty
    kubelet.write_bytes(b"")
    own(kubelet, victim, 0o644)
    env = pod_env(pod, base, TMAGUARD_STRICT="1", TMAGUARD_RECORD_DIR=str(base / "records"))
    command = as_kubelet_container([*as_user(victim), sys.executable, "-c", ACTIVATE], kubelet)
    done = _run(command, env, base)
    assert (base / "victim-file").read_bytes() == VICTIM_DATA, (
        "the stop was written through TMAGUARD_ROOT's link"
    )
    assert done.returncode != 0 and "stopped start-up" in done.stderr, done.stdout + done.stderr
    message = kubelet.read_text()
    assert "stopped start-up" in message and "TMAGUARD_RECORD_DIR is refused" in message, message


def test_strict_stop_never_follows_a_termination_log_that_is_a_link(strict_scene) -> None:  # type: ignore[no-untyped-def]
    """Item 3: the container's /dev/termination-log itself a symbolic link (in a private mount namespace) to
    a file V can write; no TMAGUARD_ROOT. At 1cc570e the stop was appended through the link. Now: the link
    is not followed (nothing written anywhere), and start-up still stops with the message on stderr."""
    base, victim = strict_scene
    env = {**scrubbed_environ(), "HOME": str(base), "TMAGUARD_STRICT": "1",
           "TMAGUARD_RECORD_DIR": str(base / "records")}  # fmt: skip
    command = with_linked_termination_log(
        [*as_user(victim), sys.executable, "-c", ACTIVATE], base / "victim-file"
    )
    done = _run(command, env, base)
    assert (base / "victim-file").read_bytes() == VICTIM_DATA, "the stop was written through the link"
    assert done.returncode != 0 and "stopped start-up" in done.stderr, done.stdout + done.stderr
