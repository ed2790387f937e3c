"""The rendered manifests of every kustomization under deploy/k8s, once per module: the zero-image overlay's
configMapGenerator given the release wheel, which the repository does not hold."""

from __future__ import annotations

from pathlib import Path

import pytest
from deploykit import DEPLOY, KUSTOMIZATIONS, render


@pytest.fixture(scope="module")
def wheel_supplied(release) -> dict[str, Path]:
    """The file the zero-image overlay's generator reads: the x86_64 release wheel."""
    return {"vllm-tmaguard.whl": release.wheels["x86_64"]}


@pytest.fixture(scope="module")
def rendered(wheel_supplied) -> dict[str, list[dict]]:
    return {name: render.build(DEPLOY / "k8s" / name, wheel_supplied) for name in KUSTOMIZATIONS}
