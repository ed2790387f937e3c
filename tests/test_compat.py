"""The version matrix's committed results (docs/compat.json, docs/compat.md from scripts/test_versions.sh)
against the code: every release passed every cell, every routing table was exercised by a release of its
own, the page is what the data renders to, and the default release is what CI's environment installs."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "versions"))

from compat_doc import COLUMNS, DATA, PAGE, render  # noqa: E402
from releases import DEFAULT_RELEASE, RELEASES  # noqa: E402

from vllm_tmaguard.stages.routing_table import TABLES, table_for  # noqa: E402

DATA_NOW = json.loads(DATA.read_text())


def test_page_is_generated_from_the_data() -> None:
    assert PAGE.read_text() == render(DATA_NOW), "docs/compat.md edited by hand: run scripts/test_versions.sh"


def test_every_release_passed_every_cell() -> None:
    failed = {
        (version, column): cells.get(column)
        for version, cells in DATA_NOW["releases"].items()
        for column in COLUMNS
        if not (cells.get(column) or {}).get("ok")
    }
    assert set(DATA_NOW["releases"]) == {r.vllm for r in RELEASES}
    assert failed == {}


def test_every_routing_table_is_exercised_by_a_release() -> None:
    exercised = {table_for(version)[0].since for version in DATA_NOW["releases"]}
    assert exercised == {table.since for table in TABLES}


def test_default_release_is_what_setup_env_installs() -> None:
    script = (ROOT / "scripts" / "setup_env.sh").read_text()
    default = next(r for r in RELEASES if r.vllm == DEFAULT_RELEASE)
    assert f"TMAGUARD_TEST_VLLM:-{default.vllm}}}" in script
    assert f"TMAGUARD_TEST_TORCH:-{default.torch}}}" in script


def test_readme_states_the_supported_range() -> None:
    first, last = RELEASES[0].vllm, RELEASES[-1].vllm
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert re.search(rf"vLLM {re.escape(first)} to {re.escape(last)}\b", readme)
