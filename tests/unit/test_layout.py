"""The package's shape (README's Layout): no import cycle; nothing below an entry point imports one (the
pipeline modules never import the doctor or the command line, the doctor's findings never import what
gathers or renders); no module over 400 lines unless its docstring says why ("Long because ...")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_tmaguard"
MAX_LINES = 400
ENTRY_POINTS = {"vllm_tmaguard.cli", "vllm_tmaguard.__main__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The package's modules this file imports, at any level (lazy imports count: they run too)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            target = f"{base}.{node.module}" if node.level and node.module else (node.module or base)
            found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {f for f in found if f in MODULES and f != name}


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: imports(path) for name, path in MODULES.items()}


def test_no_import_cycle() -> None:
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        assert name not in trail, " -> ".join([*trail[trail.index(name) :], name])
        if name not in done:
            for target in sorted(GRAPH[name]):
                visit(target, [*trail, name])
            done.add(name)

    for name in sorted(GRAPH):
        visit(name, [])


def test_no_upward_import() -> None:
    doctor = "vllm_tmaguard.doctor"
    for name, targets in GRAPH.items():
        if name not in ENTRY_POINTS and not name.startswith(doctor):
            assert not {t for t in targets if t in ENTRY_POINTS or t.startswith(doctor)}, name
        if name.startswith(f"{doctor}.findings"):
            assert all(not t.startswith(doctor) or t.startswith(f"{doctor}.findings") for t in targets), name
        if name in (f"{doctor}.render", f"{doctor}.gather", f"{doctor}.children", f"{doctor}.hooks"):
            assert f"{doctor}.command" not in targets, name
    assert GRAPH[f"{doctor}.render"] <= {f"{doctor}.findings.base", f"{doctor}.findings"}


def test_no_module_over_400_lines_without_a_reason() -> None:
    for name, path in MODULES.items():
        lines = len(path.read_text().splitlines())
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert lines <= MAX_LINES or "Long because" in docstring, f"{name}: {lines} lines"


def test_every_module_imports() -> None:
    """Annotations of the value types are evaluated at import (no `from __future__ import annotations`
    there: string annotations cost start-up time), so a forward reference shows here."""
    import importlib

    skipped = {"vllm_tmaguard.__main__", "vllm_tmaguard._import_hook"}  # run things when imported
    for name in sorted(set(MODULES) - skipped):
        importlib.import_module(name)
