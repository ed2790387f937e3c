"""tests/unit: the pure steps, with nothing built and no process started by a fixture. A test here that asks
for a pod, a stand-in library or a release build belongs beside the pod tests instead."""

from __future__ import annotations

import pytest

BUILDING_FIXTURES = frozenset({"standins", "pods", "run_python", "release", "libs", "old_vllm"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        building = BUILDING_FIXTURES & set(getattr(item, "fixturenames", ()))
        if building and item.path.is_relative_to(__file__.rsplit("/", 1)[0]):
            raise pytest.UsageError(f"{item.nodeid} is a unit test but uses {', '.join(sorted(building))}")
