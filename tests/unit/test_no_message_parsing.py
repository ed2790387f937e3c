"""No module parses another module's messages (issue 19): the prose fields of the typed values (a problem's
cause, consequence and fix, a verdict's reason, a route's why, the record's summary, a layer's evidence)
are rendered for people and never read back. Decisions use codes, kinds, symbols and numbers."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_tmaguard"
PROSE = frozenset(
    {"cause", "consequence", "fix", "reason", "why", "summary", "evidence", "hints", "stale", "error"}
)
# Facts kept as text for people whose typed form is what decisions use (compute capability: a tuple).
TEXT_OF_NUMBERS = frozenset({"compute_capability"})
STRING_METHODS = frozenset(
    {
        "startswith",
        "endswith",
        "split",
        "rsplit",
        "partition",
        "rpartition",
        "find",
        "rfind",
        "index",
        "count",
    }
)
REGEX_FUNCTIONS = frozenset({"search", "match", "fullmatch", "findall", "finditer", "split", "sub"})


def _prose(node: ast.AST) -> str | None:
    """The prose field `node` reads (`x.cause`, `x["cause"]`), or None."""
    fields = PROSE | TEXT_OF_NUMBERS
    if isinstance(node, ast.Attribute) and node.attr in fields:
        return node.attr
    if isinstance(node, ast.Subscript):
        key = node.slice
        if isinstance(key, ast.Constant) and key.value in fields:
            return key.value
    return None


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def parses_of_prose(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place `source` reads a prose field as data."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver, method = node.func.value, node.func.attr
            if method in STRING_METHODS and (field := _prose(receiver)):
                found.append((node.lineno, f"{field}.{method}()"))
            is_re = isinstance(receiver, ast.Name) and receiver.id == "re"
            if is_re and method in REGEX_FUNCTIONS and any(_prose(a) for a in node.args):
                found.append((node.lineno, f"re.{method}() on a prose field"))
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands, operands[1:], strict=False):
                if isinstance(op, (ast.In, ast.NotIn)) and (field := _prose(right)):
                    found.append((node.lineno, f"`in {field}`"))
                elif isinstance(op, (ast.Eq, ast.NotEq)):
                    sides = ((left, right), (right, left))
                    if any(_prose(a) and not _is_none(b) for a, b in sides):
                        found.append((node.lineno, "a prose field compared for equality"))
    return sorted(found)


def test_the_checker_finds_each_kind_of_parse() -> None:
    sample = """
if problem.cause.startswith("could not load"): pass
if "loaded before" in record["summary"]: pass
if verdict.reason == "no driver": pass
re.search("sm_90", route.why)
first = problem.fix.split(";")[0]
missing = [row for row in rows if row["error"] == _MISSING]
sm90 = gpu["compute_capability"].startswith("9.")
"""
    assert [line for line, _ in parses_of_prose(sample)] == [2, 3, 4, 5, 6, 7, 8]
    typed = "if problem.code == 'overlay-failed' and 'x' in action.target and row['error'] is None: pass"
    assert parses_of_prose(typed) == []


def test_no_module_reads_a_message_back() -> None:
    offences = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, what in parses_of_prose(path.read_text())
    ]
    assert not offences, "\n".join(offences)
