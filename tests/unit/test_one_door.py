"""Every file the package opens, lists, creates, renames or removes goes through vllm_tmaguard/files.py
(docs/design.md §4.2): its checks (no link followed, no blocking, a size cap, the private directory judged
one way, atomic writes) hold only if no other module goes around them. Read from the source's syntax tree:
a call of a file-touching function of os, shutil, tempfile or mmap, or of the builtin open, anywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_tmaguard"
DOOR = PACKAGE / "files.py"
TOUCHING = {
    "os": {
        "open", "listdir", "scandir", "walk", "replace", "rename", "mkdir", "makedirs", "unlink", "remove",
        "rmdir", "link", "symlink", "chmod", "chown", "truncate", "mkfifo", "memfd_create", "fdopen",
    },
    "shutil": {"copy", "copy2", "copyfile", "copytree", "rmtree", "move"},
    "tempfile": {"mkdtemp", "mkstemp", "NamedTemporaryFile", "TemporaryDirectory", "TemporaryFile"},
    "mmap": {"mmap"},
}  # fmt: skip
# Where a module must touch a file another way, and why (each entry is a decision, read in review).
ALLOWED = {
    ("stages/overlay.py", "os.memfd_create"): "the in-memory overlay for a read-only record directory",
    ("stages/vllm_probe.py", "os.walk"): "listing vLLM's tree where its RECORD is missing: names, no reads",
}


def touching_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        if isinstance(function, ast.Name) and function.id == "open":
            found.append("open")
        elif (
            isinstance(function, ast.Attribute)
            and isinstance(function.value, ast.Name)
            and function.attr in TOUCHING.get(function.value.id, ())
        ):
            found.append(f"{function.value.id}.{function.attr}")
    return found


def test_only_the_door_touches_files() -> None:
    outside = {
        (str(path.relative_to(PACKAGE)), call)
        for path in PACKAGE.rglob("*.py")
        if path != DOOR
        for call in touching_calls(path)
    }
    assert outside - set(ALLOWED) == set()


def test_the_door_is_where_the_touching_is() -> None:
    """The check above looks for the calls it names: it finds them in the door (so it would find them
    elsewhere)."""
    calls = set(touching_calls(DOOR))
    assert {"os.open", "os.listdir", "os.replace", "os.mkdir", "os.unlink", "os.link"} <= calls
