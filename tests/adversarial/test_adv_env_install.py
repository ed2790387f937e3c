"""`tmaguard env --install-dir D` into a directory others can write (issue 25, item 16, the env part): the
overlay installed there is code every vLLM process of the container loads, so nobody but root and this user
may be able to replace it. kubelet makes emptyDir volumes 0777: one that is this user's is made 0755 and the
output says so; one that is another user's (a co-tenant's 0777 directory, or root's emptyDir seen by a
non-root pod user) is refused, with its path and why, nothing written, and the shipped preflight keeps it
off the library path. Run as a fresh non-root uid V (setpriv) on an emulated vCUDA pod."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from advkit_a import (
    TMAGUARD,
    fake_vllm,
    fresh_uids,
    own,
    pod_env,
    pod_in,
    preflight_script,
    run_as,
    snapshot,
    user_bin,
    world_base,
)
from podkit import Pod


@pytest.fixture(scope="module")
def vcuda() -> Iterator[tuple[Path, Pod]]:
    with world_base("tmaguard-adv-a-env-") as base:
        yield base, pod_in(base, "vcuda", cc="9.0")


@pytest.fixture
def users() -> Iterator[tuple[int, int]]:
    """(V, M): the pod's user and a co-tenant."""
    with fresh_uids(2) as (victim, attacker):
        yield victim, attacker


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_env_tightens_a_world_writable_directory_of_this_user_and_says_so(vcuda, users) -> None:  # type: ignore[no-untyped-def]
    """Item 16: D is V's own and 0777 (an emptyDir with fsGroup, or made so by hand). At 1cc570e `tmaguard
    env --install-dir D` wrote the overlay there and said nothing: anyone could replace it before vLLM loaded
    it. Now D is made 0755 before the overlay is written, and the output says so."""
    base, pod = vcuda
    victim, _ = users
    install = base / f"overlay-{victim}"
    install.mkdir()
    own(install, victim, 0o777)
    done = run_as(victim, [*TMAGUARD, "env", "--install-dir", str(install)], pod_env(pod, base), base)
    assert _mode(install) == 0o755, f"{install} left mode {_mode(install):04o}"
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{install} was mode 0777: made 0755" in done.stdout, done.stdout
    assert f"installed {install}/libcuda.so.1" in done.stdout, done.stdout
    overlay = install / "libcuda.so.1"
    assert overlay.lstat().st_uid == victim and _mode(overlay) & 0o022 == 0


@pytest.mark.parametrize("owner", ["co-tenant", "root"])
def test_env_refuses_a_world_writable_directory_of_another_user(vcuda, users, owner: str) -> None:  # type: ignore[no-untyped-def]
    """Item 16: D is 0777 and not V's: a co-tenant M's, or root's (an emptyDir as kubelet makes it, seen by a
    non-root pod user). V cannot tighten it, and whoever owns it (or anyone, through 0777) could swap the
    overlay. At 1cc570e V wrote the overlay there (exit 0). Now: exit status 1, nothing written, the output
    names D and why."""
    base, pod = vcuda
    victim, attacker = users
    uid = attacker if owner == "co-tenant" else 0
    install = base / f"overlay-{victim}"
    install.mkdir()
    own(install, uid, 0o777)
    before = snapshot(install)
    done = run_as(victim, [*TMAGUARD, "env", "--install-dir", str(install)], pod_env(pod, base), base)
    assert snapshot(install) == before and _mode(install) == 0o777, "something was written into D"
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"refused: {install}" in done.stdout, done.stdout
    why = f"{install} is owned by uid {uid}" if uid else f"{install} is writable by"  # group 0 or others
    assert why in done.stdout, done.stdout


def test_the_preflight_keeps_a_co_tenants_overlay_dir_off_the_library_path(vcuda, users) -> None:  # type: ignore[no-untyped-def]
    """Item 16 (the shipped preflight, rendered from deploy/k8s): PREFLIGHT_OVERLAY_DIR is M's 0777
    directory. At 1cc570e the preflight's own chmod failed (logged), `tmaguard env` installed the overlay
    there anyway and the directory went first on vLLM's LD_LIBRARY_PATH: M could replace what every vLLM
    process loads. Now: nothing written there, the refusal logged with its reason, the directory not on
    vLLM's library path, vLLM still started."""
    _, pod = vcuda
    victim, attacker = users
    with world_base("tmaguard-adv-a-preflight-") as scene:
        install = scene / "overlay"
        install.mkdir()
        own(install, attacker, 0o777)
        records = scene / "records"
        records.mkdir()
        own(records, victim, 0o777)
        bin_dir = fake_vllm(scene)
        env = pod_env(
            pod, scene,
            PATH=f"{bin_dir}:{user_bin(scene, victim)}:/usr/bin:/bin",
            PREFLIGHT_OVERLAY_DIR=str(install),
            LD_LIBRARY_PATH=f"{install}:{pod.lib_dir}",  # what overlay-env.yaml sets
            TMAGUARD_RECORD_DIR=str(records),
            PREFLIGHT_TERMINATION_LOG=str(scene / "no-termination-log"),
        )  # fmt: skip
        done = run_as(victim, ["/bin/sh", str(preflight_script(scene)), "m"], env, scene, timeout=120)
        assert list(install.iterdir()) == [], (
            "the preflight installed the overlay into the co-tenant's directory"
        )
        assert "VLLM RAN serve m" in done.stdout, done.stdout + done.stderr
        assert f"VLLM LD_LIBRARY_PATH={pod.lib_dir}\n" in done.stdout, done.stdout
        assert f"refused: {install}" in done.stderr and f"owned by uid {attacker}" in done.stderr, done.stderr
