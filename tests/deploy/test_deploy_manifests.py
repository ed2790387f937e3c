"""Every kustomization under deploy/k8s renders (deploy/render.py: kustomize's `resources`, JSON 6902
`patches` and `images`) and validates against the strict Kubernetes JSON schemas that the
kubernetes-validate package ships (oldest and newest version it has); yamllint; the renderer's own rules."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
from deploykit import DEPLOY, KUSTOMIZATIONS, find, render, vllm_container


def test_every_kustomization_renders_and_validates_against_the_kubernetes_schemas(
    rendered, wheel_supplied
) -> None:
    found = {str(d.relative_to(DEPLOY / "k8s")) for d in render.kustomization_dirs()}
    assert found == set(KUSTOMIZATIONS)
    for name, objects in rendered.items():
        kinds = sorted(o["kind"] for o in objects)
        configmaps = 4 if name.endswith("stock-image") else 3  # the wheel's
        assert kinds == ["ConfigMap"] * configmaps + ["Deployment", "Service"], name
        problems = [p for o in objects for p in render.schema_problems(o)]
        assert not problems, "\n".join(map(str, problems))
    assert (
        render.check(supplied=wheel_supplied) == []
    )  # `python deploy/render.py check --wheel W`: also yamllint


def test_check_says_where_the_wheel_goes_when_it_is_not_there(tmp_path) -> None:
    """Without the wheel (the repository holds none; a developer's placed one is left out of the copy) the
    zero-image overlay is the one problem, and it says the fix."""
    k8s = tmp_path / "k8s"
    shutil.copytree(DEPLOY / "k8s", k8s, ignore=shutil.ignore_patterns("*.whl"))
    (problem,) = render.check(k8s)
    assert problem.where.endswith("k8s/overlays/vcuda-stock-image")
    assert (
        "vllm-tmaguard.whl is not there" in problem.message and "tmaguard wheel-configmap" in problem.message
    )


def _break_port(d: dict) -> None:
    vllm_container([d])["ports"][0]["containerPort"] = "8000"


def _typo_field(d: dict) -> None:
    vllm_container([d])["terminationMessagePolicys"] = "FallbackToLogsOnError"


def _no_containers(d: dict) -> None:
    del d["spec"]["template"]["spec"]["containers"]


def _bad_probe(d: dict) -> None:
    vllm_container([d])["livenessProbe"]["httpGet"]["port"] = ["http"]


def _no_selector(d: dict) -> None:
    del d["spec"]["selector"]


@pytest.mark.parametrize("breakage", [_break_port, _typo_field, _no_containers, _bad_probe, _no_selector])
def test_schema_validation_rejects_a_broken_deployment(rendered, breakage) -> None:
    deployment = copy.deepcopy(find(rendered["base"], "Deployment", "vllm"))
    assert render.schema_problems(deployment) == []
    breakage(deployment)
    problems = render.schema_problems(deployment)
    assert len(problems) == len(render.KUBERNETES_VERSIONS), problems


def test_check_fails_when_a_manifest_on_disk_is_broken(tmp_path, wheel_supplied) -> None:
    k8s = tmp_path / "k8s"
    shutil.copytree(DEPLOY / "k8s", k8s)
    deployment = k8s / "base" / "deployment.yaml"
    deployment.write_text(deployment.read_text().replace("containerPort: 8000", 'containerPort: "8000"'))
    problems = render.check(k8s, wheel_supplied)
    # Every kustomization builds on the base: each of them, under each Kubernetes version checked.
    assert len(problems) == len(KUSTOMIZATIONS) * len(render.KUBERNETES_VERSIONS), problems
    assert all("ports/0/containerPort" in p.where for p in problems), problems
    (k8s / "overlays/hami/vllm-server.yaml").write_text("- {op: replace, path: /data/NOPE, value: '2'}\n")
    assert any("overlays/hami" in p.where and "NOPE" in p.message for p in render.check(k8s, wheel_supplied))


def test_schema_validation_rejects_broken_configmap_and_service(rendered) -> None:
    toggles = copy.deepcopy(find(rendered["base"], "ConfigMap", "tmaguard-toggles"))
    toggles["data"]["TMAGUARD_STRICT"] = 1  # ConfigMap values must be strings
    assert render.schema_problems(toggles)
    service = copy.deepcopy(find(rendered["base"], "Service", "vllm-api"))
    service["apiVersion"] = "v2"
    assert render.schema_problems(service)


def test_yamllint_is_clean_and_would_catch_a_bad_file(tmp_path) -> None:
    assert render.yamllint_problems() == []
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    config = YamlLintConfig(file=str(DEPLOY / ".yamllint"))
    bad = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n    name: x \ndata: {a: yes}\n"
    found = {p.rule for p in linter.run(bad, config)}
    assert {"indentation", "trailing-spaces", "truthy"} <= found


# --- the renderer itself ---------------------------------------------------------------------------------


def _kustomization(tmp_path: Path, kustomization: str, files: dict[str, str] | None = None) -> Path:
    directory = tmp_path / "k"
    directory.mkdir()
    (directory / "kustomization.yaml").write_text(kustomization)
    shutil.copy(DEPLOY / "k8s/base/deployment.yaml", directory / "deployment.yaml")
    for name, text in (files or {}).items():
        (directory / name).write_text(text)
    return directory


TARGET = "target: {group: apps, version: v1, kind: Deployment, name: vllm}"


@pytest.mark.parametrize(
    ("kustomization", "files", "message"),
    [
        ("resources: [deployment.yaml]\nnamePrefix: x-\n", {}, "does not implement"),
        (
            "resources: [deployment.yaml]\npatches:\n  - path: p.yaml\n",
            {"p.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: vllm}\n"},
            "only JSON 6902",
        ),
        (
            "resources: [deployment.yaml]\npatches:\n  - path: p.yaml\n"
            "    target: {kind: Deployment, name: nothing}\n",
            {"p.yaml": "- {op: remove, path: /spec/replicas}\n"},
            "matches no object",
        ),
        (
            f"resources: [deployment.yaml]\npatches:\n  - path: p.yaml\n    {TARGET}\n",
            {"p.yaml": "- {op: test, path: /spec/template/spec/containers/0/name, value: other}\n"},
            "p.yaml on Deployment/vllm",
        ),
        ("resources: [deployment.yaml, deployment.yaml]\n", {}, "defined twice"),
        ("resources: [missing.yaml]\n", {}, "does not exist"),
    ],
)
def test_renderer_refuses_what_kustomize_would_not_do_the_same_way(
    tmp_path, kustomization, files, message
) -> None:
    with pytest.raises(render.RenderError, match=re.escape(message)):
        render.build(_kustomization(tmp_path, kustomization, files))


def test_renderer_applies_inline_patches_and_images(tmp_path) -> None:
    directory = _kustomization(
        tmp_path,
        "resources: [deployment.yaml]\n"
        f"patches:\n  - patch: '[{{op: replace, path: /spec/replicas, value: 3}}]'\n    {TARGET}\n"
        "images:\n  - {name: vllm-tmaguard, newName: reg:5000/team/vllm, digest: 'sha256:abc'}\n",
    )
    deployment = find(render.build(directory), "Deployment", "vllm")
    assert deployment["spec"]["replicas"] == 3
    assert vllm_container([deployment])["image"] == "reg:5000/team/vllm@sha256:abc"
    assert render.split_image("reg:5000/team/vllm:v1@sha256:x") == ("reg:5000/team/vllm", "v1", "sha256:x")
    assert render.split_image("reg:5000/vllm") == ("reg:5000/vllm", "", "")
