"""The package's shape (README's Layout, docs/design.md §0.2): the top level is what every vLLM process may
import (the entry points and what a replay imports), the rest lives in wings (`stages/`: the full run;
`doctor/`; `install/`: the commands that place the guard), and nothing at the top imports a wing but three
lazy doors; no import cycle; nothing below an entry point imports one (the stages never import the doctor
or the command line, the doctor's findings never import what gathers or renders); no module over 400 lines
unless its docstring says why ("Long because ...")."""

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


WINGS = ("stages", "doctor", "install")
# The only imports of a wing by a module a vLLM process may load, each lazy and each where a replay cannot
# answer: the full run (no verdict cached), the torch-first question (torch imported before vLLM), and the
# toggles a Ray job's runtime env carries (once per job, in the process that starts it).
LAZY_DOORS = {
    ("vllm_tmaguard.guard", "vllm_tmaguard.stages.pipeline"),
    ("vllm_tmaguard._import_hook", "vllm_tmaguard.stages.early"),
    ("vllm_tmaguard.ray_hook", "vllm_tmaguard.stages.ray_env"),
}
# Where a vLLM process enters the package: the .pth's import hook, vLLM's plugin entry points, Ray's hooks.
VLLM_ENTRY_POINTS = ("vllm_tmaguard._import_hook", "vllm_tmaguard.plugin", "vllm_tmaguard.ray_hook")
TOP = {name for name, path in MODULES.items() if path.parent == PACKAGE}


def in_wing(name: str) -> bool:
    return name.split(".")[1] in WINGS if "." in name else False


def test_nothing_at_the_top_imports_a_wing_but_three_lazy_doors() -> None:
    """The command line (`cli`, `__main__`) is run by a person, never by vLLM: it may import any wing."""
    crossings = {(name, t) for name in TOP - ENTRY_POINTS for t in GRAPH[name] if in_wing(t)}
    assert crossings == LAZY_DOORS


def test_the_doors_are_lazy() -> None:
    for name, target in LAZY_DOORS:
        tree = ast.parse(MODULES[name].read_text())
        at_module_level = {f"vllm_tmaguard.{n.module.lstrip('.')}" for n in tree.body
                           if isinstance(n, ast.ImportFrom) and n.module}  # fmt: skip
        assert target in GRAPH[name] and target not in at_module_level, (name, target)


def test_the_top_is_exactly_what_a_vllm_process_may_import_and_the_command_line() -> None:
    """Every top-level module is reached from vLLM's entry points through top-level modules only: nothing of
    the full run, the doctor or the installers sits at the top, where it would read as every process's."""
    reached, todo = {"vllm_tmaguard"}, list(VLLM_ENTRY_POINTS)
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += [t for t in GRAPH[name] if not in_wing(t)]
    assert reached == TOP - ENTRY_POINTS


def test_the_rule_sees_a_wing_imported_at_the_top() -> None:
    """The rule's reader: a lazy door and a wing's own `from .. import` are both seen."""
    assert "vllm_tmaguard.stages.pipeline" in GRAPH["vllm_tmaguard.guard"]
    assert "vllm_tmaguard.files" in GRAPH["vllm_tmaguard.stages.elf"]
    assert {"vllm_tmaguard.stages", "vllm_tmaguard.doctor", "vllm_tmaguard.install"} <= set(MODULES)
