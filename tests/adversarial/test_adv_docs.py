"""Item 17: what an operator reads matches what exists. Every place the repository sends a reader to a
document section (`docs/operator.md, "No rebuild"` in a manifest, a code comment, a docstring) or to an
anchor (`[..](operator.md#fleet-visibility)`) names a heading that is there: at 1cc570e the stock-image
kustomization, the alert rules and two modules cited sections that did not exist. The prose an operator acts
on is checked against the guard's behaviour: the troubleshooting headings that quote the guard are matched
against what it really prints (at 1cc570e one quoted a text it never printed), and
tests/unit/test_toggles.py holds that a bad toggle keeps the fix."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from podkit import child_environ

REPO = Path(__file__).resolve().parents[2]
# Where an operator or a developer is sent to a document: the package, the manifests, the scripts, the docs.
SOURCES = ("vllm_tmaguard", "deploy", "scripts", "bench", "docs", "README.md", "tests/README.md")
CITATION = re.compile(r'(docs/[\w.-]+\.md), "([^"]+)"')
LINK = re.compile(r"\]\(([\w./-]*\.md)#([\w-]+)\)")


def files() -> list[Path]:
    found = []
    for source in SOURCES:
        path = REPO / source
        candidates = [path] if path.is_file() else path.rglob("*")
        found += [p for p in candidates if p.is_file() and p.suffix in (".py", ".md", ".yaml", ".sh", ".c")]
    return found


def headings(document: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in document.read_text().splitlines() if line.startswith("#")]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_every_cited_section_exists() -> None:
    missing = []
    for path in files():
        for document, wrapped in CITATION.findall(path.read_text(errors="replace")):
            section = re.sub(r"\s*\n\s*#?\s*", " ", wrapped)  # wrapped across a comment's lines
            target = REPO / document
            if not target.exists() or not any(section in heading for heading in headings(target)):
                missing.append(f"{path.relative_to(REPO)}: {document}, {section!r}")
    assert missing == []


def test_every_anchor_link_resolves() -> None:
    missing = []
    for path in files():
        if path.suffix != ".md":
            continue
        for target, fragment in LINK.findall(path.read_text()):
            document = (path.parent / target).resolve() if target else path
            if not document.exists() or fragment not in {anchor(h) for h in headings(document)}:
                missing.append(f"{path.relative_to(REPO)}: {target}#{fragment}")
    assert missing == []


def test_the_checks_find_what_they_look_for() -> None:
    """The patterns match the citations the repository does make (a check that finds nothing proves
    nothing)."""
    cited = [c for path in files() for c in CITATION.findall(path.read_text(errors="replace"))]
    assert ("docs/operator.md", "Why no init container") in cited
    assert ("docs/doctor.md", "Exit status") in cited
    assert anchor("`tmaguard doctor`: the exit status") == "tmaguard-doctor-the-exit-status"


OPERATOR = REPO / "docs" / "operator.md"
# Each troubleshooting heading that quotes the guard, and a process that makes the guard say it.
QUOTING = {
    "vllm-tmaguard (<setting>) stopped start-up: <cause>. Fix: <fix>": {
        "TMAGUARD_STRICT": "1", "TMAGUARD_LOG_FORMAT": "xml",
    },
    "PROBLEM: TMAGUARD_GEMM='fast' is not valid; fix: set TMAGUARD_GEMM to auto | hopper | portable"
    " | latency": {"TMAGUARD_GEMM": "fast"},
}  # fmt: skip


def troubleshooting_quotes() -> list[str]:
    """The headings of operator.md's Troubleshooting that quote the guard's own words."""
    text = OPERATOR.read_text().split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]
    quoted = re.findall(r"^### `([^`]+)`$", text, flags=re.MULTILINE)
    return [q for q in quoted if "tmaguard" in q.lower() and not q.startswith("tmaguard preflight")]


def test_every_heading_quoting_the_guard_is_what_it_prints(pods, tmp_path) -> None:
    assert set(troubleshooting_quotes()) == set(QUOTING), "a heading quoting the guard needs its scenario"
    for heading, env in QUOTING.items():
        done = subprocess.run(
            [sys.executable, "-c", "from vllm_tmaguard.guard import activate; activate('docs')"],
            env=child_environ(pods("nogpu"), tmp_path / "records", env), capture_output=True, text=True,
            timeout=60, cwd=tmp_path,
        )  # fmt: skip
        pattern = ".+".join(re.escape(part) for part in re.split(r"<[a-z]+>", heading))
        assert re.search(pattern, done.stdout + done.stderr), (heading, done.stdout, done.stderr)
