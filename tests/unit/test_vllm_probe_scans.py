"""The installed vLLM's scans that replaced regular expressions (a pod's first process paid milliseconds for
them: docs/benchmarks.md): the extension files a wheel's RECORD lists and the kernel names a selector file
lists, each equal to the expression it replaced on fuzzed text and on the real vLLM's files."""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_tmaguard.process import find_package_dir
from vllm_tmaguard.stages.routing_table import table_for
from vllm_tmaguard.stages.vllm_probe import _dist_info_record, _word_in, package_version, record_extensions

pytestmark = pytest.mark.unit

# What vllm_probe used before, held to a line ([^,] crossed lines: a RECORD's path never does).
RECORD_EXTENSION = re.compile(r"^(vllm/[^,\n]*\.so),", re.M)
PIECES = ["vllm/", "a", "_C", ".so", ",", "\n", ".so.1", "/", "é", "x.abi3", "sha256=", " ", "vllm"]
WORD_PIECES = ["Foo", "Bar", "_", "x", "1", " ", ".", "(", "é", "\n", "FooFoo"]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=30).map("".join))
def test_record_extensions_are_the_expressions_matches(record: str) -> None:
    assert record_extensions(record) == RECORD_EXTENSION.findall(record)


TEXTS = st.lists(st.sampled_from(WORD_PIECES), max_size=20).map("".join)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["Foo", "Bar", "FooFoo"]), TEXTS)
def test_a_whole_word_is_found_as_the_expression_finds_it(word: str, text: str) -> None:
    assert _word_in(word, text) == bool(re.search(rf"\b{word}\b", text))


def test_the_real_vllm_gives_what_the_expressions_gave() -> None:
    package_dir = find_package_dir("vllm")
    assert package_dir is not None, "vLLM is installed by scripts/setup_env.sh"
    version = package_version(package_dir)
    record = _dist_info_record(package_dir, version)
    assert record is not None
    found = record_extensions(record)
    assert found == RECORD_EXTENSION.findall(record) and len(found) >= 5
    table, _ = table_for(version)
    for relative in table.listed_in:
        with open(os.path.join(package_dir, relative), encoding="utf-8") as source:
            text = source.read()
        for kernel in table.kernels:
            assert _word_in(kernel, text) == bool(re.search(rf"\b{kernel}\b", text)), kernel
