"""The rendered manifests of every kustomization under deploy/k8s, once per module."""

from __future__ import annotations

import pytest
from deploykit import DEPLOY, KUSTOMIZATIONS, render


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render.build(DEPLOY / "k8s" / name) for name in KUSTOMIZATIONS}
