"""Item 17: what an operator reads matches what exists. Every place the repository sends a reader to a
document section (`docs/operator.md, "No rebuild"` in a manifest, a code comment, a docstring) or to an
anchor (`[..](operator.md#fleet-visibility)`) names a heading that is there: at 1cc570e the stock-image
kustomization, the alert rules and two modules cited sections that did not exist. The prose an operator acts
on is checked against the guard's behaviour in tests/adversarial/test_adv_exit_codes.py (the strict stop's
words) and tests/unit/test_toggles.py (a bad toggle keeps the fix)."""

from __future__ import annotations

import re
from pathlib import Path

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
