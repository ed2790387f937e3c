"""vllm_tmaguard/install/manifests/stream.py: a YAML stream split into documents whose texts join back to the
stream, checked against PyYAML's reading of the whole; an edited document keeps its `---` and comments."""

from __future__ import annotations

import pytest

from vllm_tmaguard.install.manifests import stream

HELM = """---
# Source: chart/templates/a.yaml
apiVersion: v1
kind: ConfigMap
metadata: {name: a}
--- # a comment after the separator
# Source: chart/templates/b.yaml
kind: Service
metadata:
  name: "b"
...
---
# only a comment
"""


def test_documents_join_back_to_the_stream_byte_for_byte() -> None:
    documents = stream.split(HELM)
    assert "".join(d.text for d in documents) == HELM
    assert [d.value and d.value["kind"] for d in documents] == ["ConfigMap", "Service", None]
    single = "kind: Pod\nmetadata: {name: p}"  # kubectl get -o yaml: no separator, no final newline
    assert [d.text for d in stream.split(single)] == [single]


def test_an_edited_document_keeps_its_separator_and_source_comment() -> None:
    second = stream.split(HELM)[1]
    text = stream.rewrite(second, {"kind": "Service", "metadata": {"name": "b2"}})
    assert text == "--- # a comment after the separator\n# Source: chart/templates/b.yaml\n" + (
        "kind: Service\nmetadata:\n  name: b2\n"
    )
    long = "x" * 300
    assert stream.dump({"command": [long]}) == f"command:\n- {long}\n"  # never folded


def test_a_separator_inside_a_block_scalar_is_not_split_blindly() -> None:
    tricky = "kind: ConfigMap\ndata:\n  x: |\n    a\n---\nkind: Pod\n"
    assert [d.value["kind"] for d in stream.split(tricky)] == ["ConfigMap", "Pod"]
    top_level_block = "--- |\n  text\n---\n"  # a document that is a block scalar: still one value each
    assert [d.value for d in stream.split(top_level_block)] == ["text\n", None]
    with pytest.raises(stream.StreamError, match="not YAML"):
        stream.split("a: [\n")
