"""What the deploy/ tests share: where things are, deploy/render.py loaded as a module, and finders for the
objects it renders."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
DEPLOY = REPO / "deploy"
OPERATOR_DOC = REPO / "docs" / "operator.md"
KUSTOMIZATIONS = ("base", "overlays/hami", "overlays/vcuda", "overlays/vcuda-stock-image")


def _load_render():  # deploy/render.py is a script, not a package module
    spec = importlib.util.spec_from_file_location("deploy_render", DEPLOY / "render.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


render = _load_render()


def find(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} objects"
    return matches[0]


def vllm_container(objects: list[dict]) -> dict:
    pod = find(objects, "Deployment", "vllm")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "vllm")
