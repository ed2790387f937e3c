"""Shared fixtures: the compiled stand-ins, emulated pods, and a runner for fresh Python subprocesses."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import podkit
import pytest
from faultkit import Result, shared_reference
from podkit import (
    DEFAULT_BUILD_DIR,
    QUICK_EXIT,
    Pod,
    Run,
    as_kubelet_container,
    build_pod,
    build_standins,
    child_environ,
    guard_lines,
)
from releasekit import Release, shared_release

UNIT_TESTS = Path(__file__).resolve().parent / "unit"
REPO = Path(__file__).resolve().parent.parent

# The suite's own record directory, for this process (test modules import vLLM, and its .pth hook runs the
# guard here) and every process a test starts without naming one (podkit.scrubbed_environ): never the
# user's default /tmp/tmaguard-<uid>, whose records `tmaguard doctor` would then report. Set before any test
# module is imported.
SUITE_RECORDS = tempfile.mkdtemp(prefix="tmaguard-suite-records-")
os.environ["TMAGUARD_RECORD_DIR"] = podkit.SUITE_RECORD_DIR = SUITE_RECORDS
# What the suite must leave as it found it: the user's default record directory, and the demo's pod and
# records (scripts/demo.py: the demo's own line names a record there).
USERS_OWN = (Path(f"/tmp/tmaguard-{os.getuid()}"), REPO / "build" / "demo")
# humming-kernels (which vLLM's Humming kernel imports) starts two background builds of its GPU launcher at
# import, each a Python that imports torch; with no GPU they never finish a build and every vLLM process
# starts them again (about 4 CPU-seconds per vLLM start on this 2-CPU machine). Its own switch turns the
# prebuild off; it builds on first use instead, which no test reaches. Nothing the guard or vLLM's selectors
# do depends on it. Set here, so every process a test starts inherits it.
os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")


def _snapshot(path: Path) -> dict[str, tuple[int, int, int, int]] | None:
    """Every entry under `path` (links not followed) with its inode, mode, size and modification time;
    None where `path` does not exist."""
    if not os.path.lexists(path):
        return None
    entries = {}
    for directory, names, files in os.walk(path):
        for name in [".", *names, *files]:
            entry = os.path.normpath(os.path.join(directory, name))
            with contextlib.suppress(FileNotFoundError):
                info = os.lstat(entry)
                entries[entry] = (info.st_ino, info.st_mode, info.st_size, info.st_mtime_ns)
    return entries


def _controller() -> bool:
    return "PYTEST_XDIST_WORKER" not in os.environ  # with xdist: before every worker and after them all


def _tmp_names() -> set[str]:
    return set(os.listdir("/tmp")) - {Path(SUITE_RECORDS).name}  # the suite's own goes in pytest_unconfigure


def pytest_sessionstart(session: pytest.Session) -> None:
    if _controller():
        session.config.stash[_USERS_OWN] = {path: _snapshot(path) for path in USERS_OWN}
        session.config.stash[_TMP_BEFORE] = _tmp_names()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The suite fails where it changed the user's own directories (USERS_OWN) or left entries in /tmp: a
    test's files belong in its own tmp_path (once, a test left 42 directories there a run, and a fault kit
    that bound every entry of /tmp took seconds for each of its children)."""
    if not _controller() or _USERS_OWN not in session.config.stash:
        return
    changed = []
    left = sorted(_tmp_names() - session.config.stash[_TMP_BEFORE])
    if left:
        changed.append(f"/tmp: {len(left)} entries left, e.g. {', '.join(left[:5])}")
    for path, before in session.config.stash[_USERS_OWN].items():
        old, new = before or {}, _snapshot(path) or {}
        touched = sorted(entry for entry in {*old, *new} if old.get(entry) != new.get(entry))
        if touched:
            changed.append(f"{path}: {len(touched)} entries changed, e.g. {', '.join(touched[:5])}")
    if changed:
        message = "\n".join(["The suite changed what is not its own (tests use their own):", *changed])
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write("\n" + message + "\n", red=True)  # after the progress line
        else:
            print(message, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(SUITE_RECORDS, ignore_errors=True)


_USERS_OWN = pytest.StashKey[dict]()
_TMP_BEFORE = pytest.StashKey[set]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`-m unit`: the pure steps (tests/unit, seconds); `-m pod`: everything that runs emulated pods. Tests
    marked `long` go first: pytest-xdist's worksteal hands each worker a run of the list and steals from the
    ends of those runs, so a test that waits most of a minute on daemons, begun last, would end the suite
    alone (the Ray cluster: ~60 s, ~10 of them on a CPU)."""
    for item in items:
        item.add_marker(pytest.mark.unit if item.path.is_relative_to(UNIT_TESTS) else pytest.mark.pod)
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The release files, built once per run by the script a maintainer runs (once for all pytest-xdist
    workers: they share the parent of their base directories)."""
    base = tmp_path_factory.getbasetemp()
    return shared_release((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "release")


@pytest.fixture(scope="session", autouse=True)
def installed_package_is_current() -> None:
    """The tests run the installed package (its .pth hook and built shims), as users do; a stale install
    would test old code, so compare it with the source tree."""
    import vllm_tmaguard

    installed = Path(vllm_tmaguard.__file__).parent
    source = Path(__file__).resolve().parent.parent / "vllm_tmaguard"

    def differs(relative: Path) -> bool:
        copy = installed / relative
        return not copy.exists() or copy.read_bytes() != (source / relative).read_bytes()

    stale = [str(r) for r in (p.relative_to(source) for p in source.rglob("*.py")) if differs(r)]
    extra = (p.relative_to(installed) for p in installed.rglob("*.py"))  # a module removed from the source
    stale += [str(r) for r in extra if not (source / r).exists()]
    assert not stale, f"installed vllm_tmaguard differs from the source ({stale}): run scripts/setup_env.sh"


@pytest.fixture(scope="session")
def standins() -> dict[str, Path]:
    return build_standins(DEFAULT_BUILD_DIR)


@pytest.fixture(scope="session")
def pods(tmp_path_factory: pytest.TempPathFactory, standins) -> Callable[..., Pod]:
    base = tmp_path_factory.mktemp("pods")

    def make(kind: str, **gpu) -> Pod:
        return build_pod(base, kind, **gpu)

    return make


@pytest.fixture(scope="session")
def off_reference(tmp_path_factory: pytest.TempPathFactory, standins) -> Callable[..., tuple[Pod, Result]]:
    """faultkit.shared_reference: a pod and vLLM's start in it with the guard off, made once per pod kind and
    options for every pytest-xdist worker (they share the parent of their base directories)."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "off-references"

    def reference(kind: str, **options: object) -> tuple[Pod, Result]:
        key = "-".join([kind, *(f"{name}={value}" for name, value in sorted(options.items()))])
        return shared_reference(shared / key, kind, **options)

    return reference


@pytest.fixture
def run_python(tmp_path: Path) -> Callable[..., Run]:
    """Runs `code` in a fresh process inside `pod`: with this test environment's Python, or `python`; its
    records in `tmp_path / records`."""

    def run(
        pod: Pod | None,
        code: str,
        env: Mapping[str, str] | None = None,
        timeout: float = 300,
        *,
        python: str = sys.executable,
        records: str = "records",
        termination_log: Path | None = None,
        args: Sequence[str] = (),
        prefix: Sequence[str] = (),
        module: str | None = None,
    ) -> Run:
        """`termination_log`: the process sees this file as the kubelet's /dev/termination-log (a private
        mount namespace, podkit.as_kubelet_container); `args`: the process's command line after `-c`;
        `prefix`: what runs it (faultkit's prefixes); `module`: `python -m module` runs instead of `code`."""
        record_dir = tmp_path / records
        child_env = child_environ(pod, record_dir, env)
        command = [*prefix, python, *(("-m", module) if module else ("-c", code + QUICK_EXIT)), *args]
        done = subprocess.run(
            as_kubelet_container(command, termination_log) if termination_log else command,
            env=child_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=tmp_path,
        )
        guard_lines(done.stdout + "\n" + done.stderr)  # every guard line of every pod run is checked
        return Run(done.returncode, done.stdout, done.stderr, record_dir)

    return run


@pytest.fixture(scope="session")
def stock_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python whose site-packages holds everything this test environment has except vllm-tmaguard."""
    root = tmp_path_factory.mktemp("stock-image")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    ours = Path(sysconfig.get_paths()["purelib"])
    theirs = Path(
        subprocess.run(
            [str(root / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout.strip()
    )  # fmt: skip
    for entry in ours.iterdir():
        if not entry.name.startswith("vllm_tmaguard"):
            (theirs / entry.name).symlink_to(entry)
    return str(root / "bin/python")
