"""The release workflow: valid and audited, and the order a release needs (build and auditwheel, the wheel
run in a Python without a compiler, then publishing by trusted publishing on a tag only)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

WORKFLOW = Path(__file__).resolve().parents[1] / ".github/workflows/release.yml"


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent))
    assert path, f"{name} is missing: scripts/setup_env.sh installs it"
    return path


def test_the_workflow_is_valid_and_audited() -> None:
    """GitHub's workflow schema (vendored in check-jsonschema), then zizmor's audits offline (actions pinned
    by commit, no credentials left in the checkout, no template injection)."""
    schema = [_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)]
    done = subprocess.run(schema, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run(
        [_tool("zizmor"), "--offline", str(WORKFLOW)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_build_then_test_then_publish_on_a_tag() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert triggers["push"]["tags"] == ["v*"]
    jobs = workflow["jobs"]
    build_steps = " ".join(step.get("run", "") for step in jobs["build"]["steps"])
    assert "scripts/build_wheels.sh" in build_steps and "auditwheel show" in build_steps
    test = jobs["test-wheel"]
    assert test["needs"] == "build" and test["container"].startswith("python:3.12-slim")
    assert "! command -v cc" in " ".join(step.get("run", "") for step in test["steps"])
    publish = jobs["publish"]
    assert publish["needs"] == "test-wheel" and publish["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert publish["permissions"] == {"id-token": "write"} and workflow["permissions"] == {"contents": "read"}
    assert publish["steps"][-1]["uses"].startswith("pypa/gh-action-pypi-publish@")
