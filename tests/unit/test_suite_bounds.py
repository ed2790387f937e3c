"""The suite ends: every subprocess a test starts through subprocess's convenience functions has a timeout,
and every test has a time limit (pytest-timeout, pyproject.toml's `timeout`), so that a hung child or a
test waiting for ever fails where it hangs instead of holding CI until its own limit ends the whole run."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
WAITING = frozenset({"run", "call", "check_call", "check_output"})


def untimed(source: str) -> list[int]:
    """The lines of calls of subprocess.run/call/check_call/check_output (by any imported name) without a
    timeout (a **mapping passed on may hold one)."""
    tree = ast.parse(source)
    modules = {"subprocess"}
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "subprocess" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "subprocess":
            names |= {a.asname or a.name for a in node.names if a.name in WAITING}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        waits = (isinstance(function, ast.Name) and function.id in names) or (
            isinstance(function, ast.Attribute) and function.attr in WAITING
            and isinstance(function.value, ast.Name) and function.value.id in modules
        )  # fmt: skip
        if waits and not {"timeout", None} & {k.arg for k in node.keywords}:
            found.append(node.lineno)
    return found


def test_every_subprocess_a_test_waits_for_has_a_timeout() -> None:
    paths = sorted(TESTS.rglob("*.py"))
    missing = [f"{path.relative_to(TESTS)}:{line}" for path in paths for line in untimed(path.read_text())]
    assert missing == []


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ("import subprocess\nsubprocess.run(['x'])", [2]),
        ("import subprocess as sp\nsp.check_output(['x'])", [2]),
        ("from subprocess import run\nrun(['x'], check=True)", [2]),
        ("from subprocess import check_call as cc\ncc(['x'])", [2]),
        ("import subprocess\nsubprocess.run(['x'], timeout=5)", []),
        ("import subprocess\nsubprocess.run(['x'], **options)", []),
        ("def run(*a): pass\nrun('x')", []),  # a test's own helper of that name
    ],
)
def test_the_check_sees_an_untimed_call(source: str, lines: list[int]) -> None:
    assert untimed(source) == lines


def test_each_test_has_a_time_limit(pytestconfig: pytest.Config) -> None:
    """pytest-timeout is installed (scripts/setup_env.sh) and pyproject.toml gives every test a limit."""
    assert pytestconfig.pluginmanager.hasplugin("timeout"), "pytest-timeout: run scripts/setup_env.sh"
    assert float(pytestconfig.getini("timeout")) > 0
