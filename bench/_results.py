"""Shared by the benchmarks: writes one script's section of docs/benchmarks.md."""

from __future__ import annotations

import os


def write_section(path: str, lines: list[str]) -> None:
    """Replaces this benchmark's section (from its heading to the next '## ') in the results file."""
    heading = lines[0]
    try:
        with open(path) as file:
            text = file.read()
    except FileNotFoundError:
        text = "# Benchmarks\n\nEach section is written by the script it names, measured side by side.\n\n"
    body = "\n".join(lines) + "\n"
    if heading in text:
        start = text.index(heading)
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + body + (text[end + 1 :] if end >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + body
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as file:
        file.write(text)
