"""Redaction (docs/SECURITY.md): values of environment variables whose names look like credentials
(HF_TOKEN, *_API_KEY, AWS_SECRET_ACCESS_KEY, ...) and anything shaped like a bearer token or URL credentials
are replaced before a record, a log line or a doctor report leaves the process."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"
_NAMED = "<redacted ${}>"
MIN_SECRET = 8  # shorter values ("1", "true") are not looked for: they would blank out ordinary text
# Names that say "credential": one of these words between underscores, or a last word KEY(S).
_SECRET_WORDS = frozenset(
    [
        "TOKEN",
        "TOKENS",
        "SECRET",
        "SECRETS",
        "PASSWORD",
        "PASSWD",
        "PASSPHRASE",
        "APIKEY",
        "CREDENTIAL",
        "CREDENTIALS",
        "AUTH",
        "AUTHORIZATION",
        "COOKIE",
        "PRIVATE",
    ]
)
# Shapes of credentials, wherever they appear, each with the literals one of which it must contain: a text
# without any costs a few substring tests, and a pattern is compiled only once a text needs it (compiling
# them all would cost the guard a millisecond at import).
_SHAPES = (
    (("earer",), r"[Bb]earer\s+[A-Za-z0-9._~+/=-]{8,}"),  # HTTP Authorization values
    (("Basic",), r"Basic\s+[A-Za-z0-9+/=]{8,}"),
    (("hf_",), r"hf_[A-Za-z0-9]{20,}"),  # Hugging Face
    (("sk-",), r"sk-[A-Za-z0-9_-]{20,}"),  # OpenAI-style
    (("ghp_", "gho_", "ghs_", "ghr_", "ghu_"), r"gh[opsru]_[A-Za-z0-9]{20,}"),  # GitHub
    (("github_pat_",), r"github_pat_[A-Za-z0-9_]{20,}"),
    (("glpat-",), r"glpat-[A-Za-z0-9_-]{20,}"),  # GitLab
    (("AKIA", "ASIA"), r"(?:AKIA|ASIA)[0-9A-Z]{16}"),  # AWS access key id
    (("xox",), r"xox[abprs]-[A-Za-z0-9-]{10,}"),  # Slack
    (("eyJ",), r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWT
    (("://",), r"(?<=://)[^/\s:@\"]+:[^/\s@\"]+(?=@)"),  # user:password@ in URLs
)


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


_TRIGGERS = tuple((trigger, pattern) for triggers, pattern in _SHAPES for trigger in triggers)


def _shapes_in(text: str) -> list[re.Pattern[str]]:
    """The credential shapes worth looking for in `text` (usually none)."""
    return [_compiled(pattern) for trigger, pattern in _TRIGGERS if trigger in text]


def secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential."""
    upper = name.upper()
    if upper.endswith("_SOCK") or upper == "PWD":  # SSH_AUTH_SOCK, the working directory
        return False
    words = upper.split("_")
    return words[-1] in ("KEY", "KEYS") or "API_KEY" in upper or not _SECRET_WORDS.isdisjoint(words)


def _shaped(value: str) -> bool:
    return any(pattern.fullmatch(value) for pattern in _shapes_in(value))


def secret_values(environ: Mapping[str, str]) -> dict[str, str]:
    """{value: variable} for every variable whose name or value looks like a credential."""
    candidates = [(name, value) for name, value in environ.items() if len(value) >= MIN_SECRET]
    shapes = bool(_shapes_in("\n".join(value for _, value in candidates)))  # usually none: one pass
    found: dict[str, str] = {}
    for name, value in candidates:
        if secret_name(name) or (shapes and _shaped(value.strip())):
            found.setdefault(value, name)
    return found


class Redactor:
    """Replaces the environment's secrets and credential-shaped text in strings and JSON-like values."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        values = secret_values(os.environ if environ is None else environ)
        self._values = sorted(values.items(), key=lambda item: -len(item[0]))
        # How each value appears inside JSON text (quotes and backslashes escaped), for the quick test.
        self._escaped = [json.dumps(value, ensure_ascii=False)[1:-1] for value, _ in self._values]

    def text(self, text: str) -> str:
        for value, name in self._values:
            if value in text:
                text = text.replace(value, _NAMED.format(name))
        for pattern in _shapes_in(text):
            text = pattern.sub(REDACTED, text)
        return text

    def _hits(self, text: str) -> bool:
        return any(v in text for v in self._escaped) or any(p.search(text) for p in _shapes_in(text))

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if not self._hits(json.dumps(value, ensure_ascii=False, default=str)):
            return value  # the usual case: one serialisation and a few substring tests
        return self._walk(value)

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self._walk(k) if isinstance(k, str) else k: self._walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._walk(v) for v in value)
        return value


def redact(value: Any, environ: Mapping[str, str] | None = None) -> Any:
    """`value` (a string, or dicts/lists of them) with the environment's secrets replaced."""
    return Redactor(environ)(value)


def shows_redaction(text: str) -> bool:
    """Whether `text` (a redacted record, say) has anything replaced in it."""
    return REDACTED in text or _NAMED.split("{")[0] in text
