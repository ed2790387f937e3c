"""Fixtures of the stand-in tests: the compiled stand-ins, and one pod of every kind (podkit.KINDS)."""

from __future__ import annotations

from pathlib import Path

import podkit
import pytest


@pytest.fixture(scope="session")
def libs() -> dict[str, Path]:
    return podkit.build_standins(podkit.DEFAULT_BUILD_DIR)


@pytest.fixture(scope="session")
def pods(libs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, podkit.Pod]:
    base = tmp_path_factory.mktemp("pods")
    return {kind: podkit.build_pod(base, kind) for kind in podkit.KINDS}


@pytest.fixture(scope="session")
def old_vllm(libs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return podkit.build_old_vllm(tmp_path_factory.mktemp("old"))
