"""Every file the package opens, lists, creates, renames or removes goes through vllm_tmaguard/files.py or
its other room, stages/door.py (docs/design.md §4.2): their checks (no link followed, no blocking, a size
cap, the private directory judged one way, atomic writes) hold only if no other module goes around them.
Read from the source's syntax tree: any use anywhere else of a file-touching function of os, shutil,
tempfile, mmap, io or codecs, of the builtin open, of glob or pathlib, under whatever name it was imported
or assigned to."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_tmaguard"
DOORS = (PACKAGE / "files.py", PACKAGE / "stages" / "door.py")  # the door and its other room
EVERY = frozenset({"*"})  # every name of the module: it exists to list or open files
TOUCHING: dict[str, frozenset[str]] = {
    "os": frozenset({
        "open", "listdir", "scandir", "walk", "fwalk", "replace", "rename", "renames", "mkdir", "makedirs",
        "unlink", "remove", "removedirs", "rmdir", "link", "symlink", "chmod", "chown", "lchown", "truncate",
        "mkfifo", "mknod", "memfd_create", "fdopen", "popen",
    }),
    "shutil": frozenset({"copy", "copy2", "copyfile", "copytree", "copymode", "copystat", "rmtree", "move"}),
    "tempfile": frozenset({
        "mkdtemp", "mkstemp", "NamedTemporaryFile", "TemporaryDirectory", "TemporaryFile",
        "SpooledTemporaryFile",
    }),
    "mmap": frozenset({"mmap"}),
    "io": frozenset({"open", "open_code", "FileIO"}),
    "_io": frozenset({"open", "open_code", "FileIO"}),
    "codecs": frozenset({"open"}),
    "builtins": frozenset({"open"}),
    "glob": EVERY,
    "pathlib": EVERY,
}  # fmt: skip
# Where a module must touch a file another way, and why (each entry is a decision, read in review).
ALLOWED = {
    ("stages/overlay.py", "os.memfd_create"): "the in-memory overlay for a read-only record directory",
    ("stages/vllm_probe.py", "os.walk"): "listing vLLM's tree where its RECORD is missing: names, no reads",
}


def _touches(module: str, name: str) -> bool:
    names = TOUCHING.get(module, frozenset())
    return names is EVERY or name in names


def _annotations(tree: ast.AST) -> list[ast.expr]:
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            found.append(node.returns)
        elif isinstance(node, (ast.arg, ast.AnnAssign)) and node.annotation is not None:
            found.append(node.annotation)
    return found


def touching(source: str) -> list[str]:
    """The file-touching functions `source` uses ("os.open", "open", "pathlib.*"...): called, referred to
    (an alias `o = open`, a callback), imported by name (`from os import open as o`, `from pathlib import
    Path`), or fetched with getattr(os, "open"); the builtin open unless the module binds the name itself."""
    tree = ast.parse(source)
    modules: dict[str, str] = {"builtins": "builtins"}  # local name -> the module it is
    found: list[str] = []
    own_open = False
    annotations = {id(part) for annotation in _annotations(tree) for part in ast.walk(annotation)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.partition(".")[0]
                modules[alias.asname or top] = alias.name if alias.asname else top
                if alias.name in TOUCHING and TOUCHING[alias.name] is EVERY:
                    found.append(f"{alias.name}.*")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if (alias.name == "*" and node.module in TOUCHING) or _touches(node.module, alias.name):
                    found.append(f"{node.module}.{alias.name}")
                own_open |= (alias.asname or alias.name) == "open"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own_open |= node.name == "open"
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own_open |= node.id == "open"
    for node in ast.walk(tree):
        if id(node) in annotations:  # a type named (mmap.mmap), nothing used
            continue
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = modules.get(node.value.id)
            if module is not None and _touches(module, node.attr):
                found.append(f"{module}.{node.attr if TOUCHING[module] is not EVERY else '*'}")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id == "open":
            if not own_open:
                found.append("open")
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[0], ast.Name)
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
        ):  # fmt: skip
            module = modules.get(node.args[0].id)
            if module is not None and _touches(module, node.args[1].value):
                found.append(f"{module}.{node.args[1].value}")
    return found


def touching_calls(path: Path) -> list[str]:
    return touching(path.read_text())


def test_only_the_door_touches_files() -> None:
    outside = {
        (str(path.relative_to(PACKAGE)), call)
        for path in PACKAGE.rglob("*.py")
        if path not in DOORS
        for call in touching_calls(path)
    }
    assert outside - set(ALLOWED) == set()


def test_the_door_is_where_the_touching_is() -> None:
    """The check above looks for the calls it names: it finds them in the door and its other room (so it
    would find them elsewhere)."""
    door, other_room = (set(touching_calls(path)) for path in DOORS)
    assert {"os.open", "os.scandir", "os.replace", "os.unlink", "os.link"} <= door
    assert {"os.open", "os.listdir", "os.mkdir", "os.makedirs", "tempfile.mkdtemp"} <= other_room


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import io\nio.open(p)", ["io.open"]),
        ("from os import open as o\no(p, 0)", ["os.open"]),
        ("o = open\no(p)", ["open"]),
        ("import os as system\nsystem.open(p, 0)", ["os.open"]),
        ("import os\nopener = os.open", ["os.open"]),
        ("import os\ngetattr(os, 'listdir')(p)", ["os.listdir"]),
        ("from pathlib import Path\nPath(p).read_text()", ["pathlib.Path"]),
        ("import pathlib\npathlib.Path(p).read_bytes()", ["pathlib.*", "pathlib.*"]),
        ("from pathlib import Path as P\nwith P(p).open() as f: pass", ["pathlib.Path"]),
        ("import glob\nglob.glob(p)", ["glob.*", "glob.*"]),
        ("from glob import iglob\niglob(p)", ["glob.iglob"]),
        ("import os\nos.scandir(p)", ["os.scandir"]),
        ("import builtins\nbuiltins.open(p)", ["builtins.open"]),
        ("import codecs\ncodecs.open(p)", ["codecs.open"]),
        ("from os import *", ["os.*"]),
        # Not a file touched: the door's own functions, a method of that name, a module's own open.
        ("from . import files, door\nfiles.read_bytes(p); door.glob(p); door.listdir(p)", []),
        ("import os\nos.path.join(p, 'x'); os.stat(p); os.O_RDONLY", []),
        ("def open(p): pass\nopen(p)", []),
        ("import mmap\ndef f(image: mmap.mmap) -> mmap.mmap: pass", []),
        ("import mmap\ndef f(image: mmap.mmap = mmap.mmap(-1, 1)): pass", ["mmap.mmap"]),
        ("text.replace('a', 'b'); handle.open()", []),
    ],
)
def test_the_check_sees_every_way_to_touch_a_file(source: str, found: list[str]) -> None:
    """The one-door check above finds an import of io, an alias, pathlib's reads, glob and getattr, and
    nothing in the door's own calls."""
    assert sorted(touching(source)) == sorted(found)
