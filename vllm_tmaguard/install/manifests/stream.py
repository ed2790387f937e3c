"""A YAML stream split into its documents, each with its own text, so that a document nobody changes is
written back byte for byte. The split is checked against PyYAML's own reading of the whole stream."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

_SEPARATOR = re.compile(r"^---(?:[ \t].*)?$")


class StreamError(ValueError):
    """A stream this module cannot split with certainty, or that is not YAML."""


@dataclass
class Document:
    text: str  # exactly as read: its separator line (if any), comments, content
    value: Any  # the parsed document; None for one holding comments only


def split(text: str) -> list[Document]:
    """The documents of `text`, in order; their texts joined are `text`. Raises StreamError."""
    chunks: list[list[str]] = [[]]
    for line in text.splitlines(keepends=True):
        if _SEPARATOR.match(line.rstrip("\r\n")) and chunks[-1]:
            chunks.append([])
        chunks[-1].append(line)
    try:
        documents = [Document("".join(c), yaml.safe_load("".join(c))) for c in chunks]
        whole = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise StreamError(f"not YAML: {error}") from None
    if [d.value for d in documents if d.value is not None] != whole:
        raise StreamError("its documents cannot be told apart line by line (a '---' inside a block scalar?)")
    return documents


def dump(value: Any) -> str:
    """A document's YAML: keys in their order, block style, long strings never folded."""
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 16)


def rewrite(document: Document, value: Any) -> str:
    """The text of `document` with its content replaced by `value`: its separator line and the comment lines
    before its content (Helm's `# Source:`) kept."""
    lines = document.text.splitlines(keepends=True)
    head = []
    for line in lines:
        stripped = line.strip()
        if _SEPARATOR.match(line.rstrip("\r\n")) or not stripped or stripped.startswith("#"):
            head.append(line if line.endswith("\n") else line + "\n")
        else:
            break
    return "".join(head) + dump(value)
