"""Helper A's kit for tests/adversarial (the record directory, the preflight, TMAGUARD_ROOT, `tmaguard env`,
`tmaguard inject`): a world-traversable base under /tmp that other uids can enter, fresh uids whose
/tmp/tmaguard-<uid> nobody made yet, commands run as one of them (setpriv), the real `tmaguard` and the real
preflight script rendered from deploy/, a real record to plant, and snapshots that prove nothing changed."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from podkit import Pod, as_kubelet_container, build_pod, scrubbed_environ

REPO = Path(__file__).resolve().parent.parent.parent
# The package as a user runs it: `python -m vllm_tmaguard` (the console script is the same entry point).
TMAGUARD = (sys.executable, "-m", "vllm_tmaguard")
MARKER = "planted-by-the-co-tenant"  # in every file another uid plants: must never show as this user's


def fallback_dir(uid: int) -> Path:
    """The guard's default record directory for `uid` (files.default_record_dir)."""
    return Path(f"/tmp/tmaguard-{uid}")


@contextlib.contextmanager
def world_base(prefix: str) -> Iterator[Path]:
    """A new directory under /tmp that every uid can enter (pytest's tmp_path is 0700), removed after."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def fresh_uids(count: int) -> Iterator[list[int]]:
    """`count` distinct uids in a high range no account uses, whose /tmp/tmaguard-<uid> does not exist yet;
    what was made there is removed after."""
    assert os.geteuid() == 0, "another uid needs root (setpriv): run the suite as root"
    uids: list[int] = []
    while len(uids) < count:
        uid = 1_700_000_000 + random.randrange(10_000_000)
        if uid not in uids and not os.path.lexists(fallback_dir(uid)):
            uids.append(uid)
    try:
        yield uids
    finally:
        for uid in uids:
            shutil.rmtree(fallback_dir(uid), ignore_errors=True)


def as_user(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def run_as(
    uid: int | None, command: list[str], env: Mapping[str, str], cwd: Path, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`command` as `uid` (None: as root), bounded: every command here must finish in seconds."""
    prefix = [] if uid is None else as_user(uid)
    return subprocess.run(
        [*prefix, *command], env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def own(path: Path, uid: int, mode: int | None = None) -> None:
    """`path` made `uid`'s (a link itself, not its target), with `mode` where given."""
    os.lchown(path, uid, uid)
    if mode is not None and not path.is_symlink():
        path.chmod(mode)


def pod_in(base: Path, kind: str = "vcuda", **gpu: Any) -> Pod:
    """An emulated pod (podkit.build_pod) under `base`, so that another uid can read it."""
    return build_pod(base / "pods", kind, **gpu)


def pod_env(pod: Pod, home: Path, **extra: str) -> dict[str, str]:
    """The environment of a process in `pod`: scrubbed, the pod's variables, `extra`. No record directory
    unless `extra` names one: these processes run as fresh uids, whose default one is their own (fresh_uids
    removes it), not the suite's (root's)."""
    env = {**scrubbed_environ(), **pod.env, "HOME": str(home), **extra}
    if "TMAGUARD_RECORD_DIR" not in extra:
        env.pop("TMAGUARD_RECORD_DIR", None)
    return env


def snapshot(directory: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry of `directory` as it is: type, mode, owner, size, mtime, and a link's target or a file's
    bytes (nothing followed)."""
    out: dict[str, tuple[Any, ...]] = {}
    for entry in sorted(directory.iterdir()):
        info = entry.lstat()
        if stat.S_ISLNK(info.st_mode):
            content: Any = os.readlink(entry)
        elif stat.S_ISREG(info.st_mode):
            content = entry.read_bytes()
        else:
            content = None
        out[entry.name] = (info.st_mode, info.st_uid, info.st_size, info.st_mtime_ns, content)
    return out


def real_record(pod: Pod, base: Path) -> dict[str, Any]:
    """A record as the guard writes it: one full run as root on `pod`, into a private directory."""
    records = base / "real-record"
    env = pod_env(pod, base, TMAGUARD_RECORD_DIR=str(records))
    done = run_as(None, [sys.executable, "-c", "from vllm_tmaguard.guard import activate; activate('t')"],
                  env, base, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = json.loads((records / "last.json").read_text())
    shutil.rmtree(records)
    return record


def planted(record: dict[str, Any]) -> bytes:
    """A healthy-looking record that names the planter (MARKER) wherever a reader would show it."""
    return json.dumps(
        {**record, "trigger": MARKER, "summary": f"all good ({MARKER})", "problems": [], "pid": 1}
    ).encode()


def _load_render() -> Any:
    spec = importlib.util.spec_from_file_location("adv_a_deploy_render", REPO / "deploy" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def preflight_script(directory: Path, overlay: str = "overlays/vcuda") -> Path:
    """The shipped preflight.sh, as the rendered ConfigMap of `overlay` carries it, written under
    `directory` (readable by every uid)."""
    objects = _load_render().build(REPO / "deploy" / "k8s" / overlay)
    (config,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "tmaguard-preflight"
    ]
    script = directory / "preflight.sh"
    script.write_text(config["data"]["preflight.sh"])
    script.chmod(0o644)
    return script


def fake_vllm(directory: Path) -> Path:
    """A `vllm` command that says it ran and with what library path (the preflight's last step: exec vllm
    serve ...)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(exist_ok=True)
    vllm = bin_dir / "vllm"
    vllm.write_text('#!/bin/sh\necho "VLLM RAN $*"\necho "VLLM LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"\n')
    vllm.chmod(0o755)
    return bin_dir


def tmaguard_bin() -> Path:
    """The directory of this environment's `tmaguard` console script (and its python3)."""
    script = Path(sys.executable).parent / "tmaguard"
    assert script.exists(), "the package's console script is missing: run scripts/setup_env.sh"
    return script.parent


def user_bin(directory: Path, uid: int) -> Path:
    """A directory holding `tmaguard` and `python3` that a shell of `uid` can run: this environment's own bin
    where `uid` may execute its interpreter, else (an interpreter under root's 0700 home, as pyenv puts it)
    a virtual environment under `directory` over the system's Python of the same version, with this
    environment's site-packages: what a process of `uid` started by setpriv runs anyway."""
    probe = run_as(
        uid, ["/bin/sh", "-c", 'exec "$0" -c pass', sys.executable], {"PATH": "/usr/bin:/bin"}, directory
    )
    if probe.returncode == 0:
        return tmaguard_bin()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = Path("/usr/bin") / version
    assert system.exists(), f"{sys.executable} cannot be run by another uid and there is no {system}"
    venv = directory / "user-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / version).mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {system.parent}\ninclude-system-site-packages = false\n")
    (venv / "bin" / "python3").symlink_to(system)
    (venv / "lib" / version / "site-packages").symlink_to(sysconfig.get_paths()["purelib"])
    body = (tmaguard_bin() / "tmaguard").read_text().split("\n", 1)[1]
    script = venv / "bin" / "tmaguard"
    script.write_text(f"#!{venv}/bin/python3\n{body}")
    script.chmod(0o755)
    return venv / "bin"


def planted_libcuda(output: Path, marker: Path) -> Path:
    """tests/csrc/adv_planted_libcuda.c built as `output`: a libcuda.so.1 whose constructor appends a line to
    `marker` (which must stay absent: the file was never loaded)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    source = REPO / "tests" / "csrc" / "adv_planted_libcuda.c"
    subprocess.run(
        ["gcc", "-O2", "-fPIC", "-shared", "-Wall", "-Werror", f'-DPLANTED_MARKER="{marker}"', "-o",
         str(output), str(source)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    output.chmod(0o755)
    return output


def with_linked_termination_log(command: list[str], target: Path) -> list[str]:
    """`command` run where /dev/termination-log is a symbolic link to `target` (a private mount namespace)."""
    return as_kubelet_container(command, target, linked=True)
