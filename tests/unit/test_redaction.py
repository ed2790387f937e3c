"""Redaction (redaction.py), each credential shape on its own and the quick check before the walk: a shape is
looked for only where one of its literals appears (redaction._SHAPES), and a value with nothing to redact
is handed back as it is after one serialisation. tests/test_security.py redacts a mixed text; here each
shape is alone in its text, so a shape that stopped matching, or a literal that no longer triggers it,
fails its own case."""

from __future__ import annotations

import pytest

from vllm_tmaguard import redaction
from vllm_tmaguard.redaction import REDACTED, Redactor, redact, secret_values

R = REDACTED
# (what the text holds, the same redacted, whether the whole value is the credential)
SHAPES = {
    "bearer": ("Authorization: Bearer abc.DEF_12~+/=-xyz", f"Authorization: {R}", False),
    "bearer, lower case": ("authorization: bearer abcdefgh12345678", f"authorization: {R}", False),
    "basic": ("Authorization: Basic QWxhZGRp+bjpvcGVu/c2VzYW1l==", f"Authorization: {R}", False),
    "hugging face": ("hf_AbCdEfGhIjKlMnOpQrStUv", R, True),
    "openai": ("sk-proj-abcdefghij_klmnopqrst", R, True),
    "github ghp_": ("ghp_0123456789abcdefghijABCD", R, True),
    "github gho_": ("gho_0123456789abcdefghijABCD", R, True),
    "github ghs_": ("ghs_0123456789abcdefghijABCD", R, True),
    "github ghr_": ("ghr_0123456789abcdefghijABCD", R, True),
    "github ghu_": ("ghu_0123456789abcdefghijABCD", R, True),
    "github fine-grained": ("github_pat_11ABCDEFG0123456789_abcdefghij", R, True),
    "gitlab": ("glpat-abcdefghij_0123456789-x", R, True),
    "aws key id": ("AKIAIOSFODNN7EXAMPLE", R, True),
    "aws temporary key id": ("ASIAIOSFODNN7EXAMPLE", R, True),
    "slack": ("xoxb-1234567890-abcdefghij", R, True),
    "slack, user": ("xoxp-1234567890-abcdefghij", R, True),
    "jwt": ("eyJhbGciOiJI.eyJzdWIiOiIx.c2lnbmF0dXJl", R, True),
    "url credentials": ("https://alice:pa55word@proxy:3128/x", f"https://{R}@proxy:3128/x", False),
}  # fmt: skip


@pytest.mark.parametrize("name", SHAPES)
def test_each_credential_shape_alone(name: str) -> None:
    held, redacted, whole = SHAPES[name]
    assert redaction._shapes_in(held), f"{name}: no shape is looked for in {held!r}"
    assert redact(f"before {held} after", {}) == f"before {redacted} after"
    # A variable whose name says nothing but whose value is the credential is a secret by its value.
    found = secret_values({"SOME_SETTING": held})
    assert found == ({held: "SOME_SETTING"} if whole else {}), found


def test_text_without_a_literal_compiles_nothing() -> None:
    """The quick check: a text holding no shape's literal is looked at by substring tests alone."""
    redaction._compiled.cache_clear()
    assert redaction._shapes_in("/usr/local/nvidia/lib64/libcuda.so.1 sm_90a vllm serve") == []
    assert redaction._compiled.cache_info().currsize == 0


def test_a_value_without_secrets_comes_back_as_it_is() -> None:
    """The fast path: nothing to redact, the very value handed back (no walk, no copy); something to
    redact, a redacted copy."""
    redactor = Redactor({"DB_PASSWORD": 'pa"ss\\word long', "HOME": "/root"})
    plain = {"path": ["/usr/local/nvidia/lib64"], "n": 3, "none": None}
    assert redactor(plain) is plain
    # The secret as it appears inside JSON (its quote and backslash escaped) is still found.
    holding = {"path": ['/pods/pa"ss\\word long/lib'], "n": 3}
    redacted = redactor(holding)
    assert redacted is not holding and redacted == {"path": ["/pods/<redacted $DB_PASSWORD>/lib"], "n": 3}
    shaped = {"auth": ["Bearer abcdefgh12345678"]}
    assert redactor(shaped) == {"auth": [REDACTED]}
