"""`tmaguard manifests` (a Helm post-renderer) on the shapes operators deploy vLLM with: charts written here
with the template shapes of vLLM's chart-helm and the production stack's chart (tests/deploy/charts),
rendered by Helm's own library (helm-python-sdk: Helm v4's Go code, no cluster), a LeaderWorkerSet and a
KServe InferenceService. What it changes validates against the same Kubernetes schemas as deploy/; what it
does not change comes back byte for byte; a second run changes nothing; the init container it adds places
the package in the stock image's Python; what it cannot tell, it refuses, saying how to name it. And
deploy/helm/production-stack-values.yaml gives the production stack's chart the same install."""

from __future__ import annotations

import copy
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import helm_python as helm
import pytest
import yaml
from deploykit import DEPLOY, find, render
from test_deploy_zero_image import _configmap_volume, _forged, run_init_container

from vllm_tmaguard.install.manifests import stream, zero_image

TMAGUARD = str(Path(sys.executable).parent / "tmaguard")
CHARTS = Path(__file__).resolve().parent / "charts"
SHAPES = Path(__file__).resolve().parent / "shapes"
MODEL = {
    "name": "qwen",
    "repository": "vllm/vllm-openai",
    "tag": "v0.32.0",
    "modelURL": "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
    "replicaCount": 1,
    "requestCPU": 4,
    "requestMemory": "32Gi",
    "requestGPU": 50,
    "requestGPUType": "tencent.com/vcuda-core",
}


def helm_template(chart: Path, values: dict, name: str = "demo") -> str:
    """The stream a post-renderer receives: each rendered manifest's documents after `---` and Helm's
    `# Source:` line (Helm's releaseutil splits a template's output on its `---` lines)."""
    with helm.Chart.load(chart) as loaded:
        rendered = loaded.render(values, name=name, namespace="default")
    out = []
    for path, text in sorted(rendered.items()):
        for document in re.split(r"(?:^|\s*\n)---\s*", text):
            if document.strip():
                out.append(f"---\n# Source: {path}\n{document.strip()}\n")
    return "".join(out)


def manifests(text: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TMAGUARD, "manifests", *args], input=text, capture_output=True, text=True, timeout=60
    )


def guarded(text: str, *args: str) -> str:
    done = manifests(text, *args)
    assert done.returncode == 0, done.stderr
    again = manifests(done.stdout, *args)
    assert again.returncode == 0 and again.stdout == done.stdout  # idempotent: a second run changes nothing
    return done.stdout


def _changed(before: str, after: str) -> list[dict]:
    """The documents that differ; every other document's text is the same, byte for byte."""
    old, new = stream.split(before), stream.split(after)
    assert len(new) >= len(old)
    changed = []
    for a, b in zip(old, new, strict=False):
        if a.text != b.text:
            assert a.text.splitlines()[:2] == b.text.splitlines()[:2]  # `---` and `# Source:` kept
            changed.append(b.value)
    return changed + [d.value for d in new[len(old) :]]


def _pod_problems(spec: dict) -> list:
    """A pod spec (of a kind whose own schema kubernetes-validate lacks) validated as a Pod's."""
    fields = {"containers", "initContainers", "volumes"}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}
    pod["spec"] = {k: v for k, v in spec.items() if k in fields}
    return render.schema_problems(pod)


def _check_guarded(
    pod_spec: dict, container_names: list[str], wheel_configmap: str = "tmaguard-wheel", pins: tuple = ()
) -> None:
    vllm = [c for c in pod_spec["containers"] if c["name"] in container_names]
    assert pod_spec["initContainers"][0] == zero_image.init_container(vllm[0], pins)
    assert zero_image.volumes(wheel_configmap) == [
        v for v in pod_spec["volumes"] if v["name"] in (zero_image.PACKAGE_VOLUME, zero_image.WHEEL_VOLUME)
    ]
    for container in vllm:
        assert container["env"][-1] == {"name": "PYTHONPATH", "value": zero_image.PACKAGE_DIR}
        assert {"name": zero_image.PACKAGE_VOLUME, "mountPath": zero_image.PACKAGE_DIR, "readOnly": True} in (
            container["volumeMounts"]
        )
        assert {"configMapRef": {"name": "tmaguard-toggles", "optional": True}} in container["envFrom"]
    others = [c for c in pod_spec["containers"] if c["name"] not in container_names]
    assert all("PYTHONPATH" not in str(c.get("env")) for c in others)


def test_vllms_chart_through_the_post_renderer(release, stock_python, tmp_path) -> None:
    before = helm_template(CHARTS / "vllm", {})
    after = guarded(before)
    (deployment,) = _changed(before, after)  # the Job, the Service, the PVC: untouched
    assert deployment["kind"] == "Deployment"
    pod = deployment["spec"]["template"]["spec"]
    _check_guarded(pod, ["vllm"])
    assert [c["name"] for c in pod["initContainers"]] == ["tmaguard-inject", "wait-download-model"]
    assert pod["initContainers"][0]["securityContext"] == {"runAsNonRoot": False}  # the vllm container's
    for document in stream.split(after):
        assert document.value is None or render.schema_problems(document.value) == []

    # The init container it added, run as the kubelet would, places the package from the wheel ConfigMap.
    printed = subprocess.run(
        [TMAGUARD, "wheel-configmap", *map(str, release.wheels.values())],
        capture_output=True,
        text=True,
        timeout=300,
    )
    volume = _configmap_volume(yaml.safe_load(printed.stdout), tmp_path / "configmap")
    package = tmp_path / "emptydir"
    package.mkdir(mode=0o777)
    done = run_init_container(pod["initContainers"][0], volume, package, Path(stock_python).parent)
    assert done.returncode == 0, done.stderr
    assert (package / "sitecustomize.py").is_file()
    assert (package / "vllm_tmaguard/lib/libtmaguard_overlay.so").is_file()


def test_a_chart_with_crlf_line_ends_comes_back_byte_for_byte(tmp_path) -> None:
    """vLLM's chart-helm files, as the code index stores them (docs/operator.md), end their lines with CRLF,
    and Helm passes the CRs through to the post-renderer: every document it does not guard comes back with
    them, byte for byte (bytes in and out, as Helm pipes them)."""
    import shutil

    chart = tmp_path / "vllm"
    shutil.copytree(CHARTS / "vllm", chart)
    for path in chart.rglob("*"):
        if path.is_file():
            path.write_bytes(path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    before = helm_template(chart, {}).encode()
    assert b"\r\n" in before
    done = subprocess.run([TMAGUARD, "manifests"], input=before, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    again = subprocess.run([TMAGUARD, "manifests"], input=done.stdout, capture_output=True, timeout=60)
    assert again.stdout == done.stdout
    split = re.compile(rb"(?m)^(?=---\r?$)")
    old, new = split.split(before)[1:], split.split(done.stdout)[1:]
    kept = [a for a, b in zip(old, new, strict=True) if a == b]
    changed = [yaml.safe_load(b.decode()) for a, b in zip(old, new, strict=True) if a != b]
    assert [d["kind"] for d in changed] == ["Deployment"] and len(kept) == len(old) - 1
    assert all(b"\r\n" in document for document in kept)
    _check_guarded(changed[0]["spec"]["template"]["spec"], ["vllm"])


def test_the_production_stacks_shape_through_the_post_renderer() -> None:
    values = {"servingEngineSpec": {"configs": {"TMAGUARD_MODE": "auto"}, "modelSpec": [MODEL]}}
    before = helm_template(CHARTS / "stack", values)
    done = manifests(before)
    assert "guarded Deployment/default/demo-qwen-deployment-vllm spec.template.spec: vllm" in done.stderr
    after = guarded(before)
    (deployment,) = _changed(before, after)  # the router, the ConfigMap, the Service: untouched
    _check_guarded(deployment["spec"]["template"]["spec"], ["vllm"])
    assert render.schema_problems(deployment) == []


def test_it_refuses_to_guess_and_says_how_to_name_the_container() -> None:
    """The LMCache server runs in a vLLM image with another command: refused (exit 1, nothing written) until
    the operator names the containers that run vLLM."""
    values = {"servingEngineSpec": {"modelSpec": [MODEL]}, "cacheserverSpec": {"enabled": True}}
    before = helm_template(CHARTS / "stack", values)
    done = manifests(before)
    assert done.returncode == 1 and done.stdout == ""
    assert "container lmcache-server: vLLM's image 'lmcache/vllm-openai:latest' with another command" in (
        done.stderr
    )
    assert 'vllm-tmaguard/containers: "NAME[,NAME]"' in done.stderr and "--container NAME" in done.stderr
    after = guarded(before, "--container", "vllm")
    (deployment,) = _changed(before, after)
    assert deployment["metadata"]["name"] == "demo-qwen-deployment-vllm"

    annotated = copy.deepcopy(MODEL) | {"podAnnotations": {"vllm-tmaguard/containers": "vllm"}}
    nothing = {"servingEngineSpec": {"modelSpec": [annotated]}, "cacheserverSpec": {"enabled": True}}
    still = manifests(helm_template(CHARTS / "stack", nothing))  # the cache server's pod is not annotated
    assert still.returncode == 1 and "lmcache-server" in still.stderr

    plain = manifests(helm_template(CHARTS / "vllm", {"extraInit": {"modelDownload": {"enabled": False}}}))
    assert plain.returncode == 0
    no_vllm = manifests(helm_template(CHARTS / "stack", {}))  # the router alone
    assert no_vllm.returncode == 1 and "no container runs vLLM here" in no_vllm.stderr


@pytest.mark.parametrize("kustomization", ["base", "overlays/vcuda", "overlays/hami"])
def test_the_repositorys_own_manifests_through_the_post_renderer(kustomization: str) -> None:
    """Issue 34: deploy/k8s/base was refused: its vllm container runs the preflight script (the
    tmaguard-preflight ConfigMap, mounted), which ends in `exec vllm serve "$@"`. A container whose command
    runs that script runs vLLM; the same command from any other volume stays unclear."""
    objects = render.build(DEPLOY / "k8s" / kustomization)
    before = "".join("---\n" + yaml.safe_dump(o, sort_keys=False) for o in objects)
    after = guarded(before)
    (deployment,) = _changed(before, after)
    pod_spec = deployment["spec"]["template"]["spec"]
    (vllm,) = pod_spec["containers"]
    assert pod_spec["initContainers"][0] == zero_image.init_container(vllm)
    assert vllm["env"][-1] == {"name": "PYTHONPATH", "value": zero_image.PACKAGE_DIR}
    assert render.schema_problems(deployment) == []

    other = copy.deepcopy(find(objects, "Deployment", "vllm"))
    for volume in other["spec"]["template"]["spec"]["volumes"]:
        if volume.get("configMap", {}).get("name") == "tmaguard-preflight":
            volume["configMap"]["name"] = "some-other-script"
    still = manifests(stream.dump(other))
    assert still.returncode == 1 and "container vllm: 'vllm' in its image or command" in still.stderr


def test_leaderworkerset_through_the_command() -> None:
    """vLLM's LWS example: the leader runs `vllm serve`, the worker vLLM's multi-node-serving.sh (the raylet
    that hosts vLLM's Ray workers): both guarded by the command itself (every multi-node shape, in this
    process: test_deploy_multinode.py)."""
    before = (SHAPES / "lws.yaml").read_text()
    done = manifests(before)
    assert done.returncode == 0, done.stderr
    assert "workerTemplate.spec: vllm-worker" in done.stderr
    assert "leaderTemplate.spec: vllm-leader" in done.stderr
    after = guarded(before)
    (changed,) = _changed(before, after)
    for role, name in (("leaderTemplate", "vllm-leader"), ("workerTemplate", "vllm-worker")):
        spec = changed["spec"]["leaderWorkerTemplate"][role]["spec"]
        _check_guarded(spec, [name])
        assert _pod_problems(spec) == []


def test_kserve_inference_service_and_a_kubectl_list() -> None:
    before = (SHAPES / "kserve.yaml").read_text()
    after = guarded(before)
    (service,) = _changed(before, after)
    predictor = service["spec"]["predictor"]
    _check_guarded(predictor, ["kserve-container"])
    assert predictor["minReplicas"] == 1 and _pod_problems(predictor) == []

    listed = stream.dump({"apiVersion": "v1", "kind": "List", "items": [yaml.safe_load(before)]})
    (as_list,) = _changed(listed, guarded(listed))
    assert as_list["items"][0] == service


def test_with_the_wheel_the_stream_carries_its_configmap(release) -> None:
    """--wheel: the ConfigMap in the stream (the release owns it), in the pods' namespace, named by content
    as kustomize would name it, and the init container pinned to the wheel's sha256; a second run adds
    nothing, and a run with another wheel moves the pin to it."""
    before = (SHAPES / "kserve.yaml").read_text()
    wheel = release.wheels["x86_64"]
    after = guarded(before, "--wheel", str(wheel))
    service, added = _changed(before, after)
    assert added["kind"] == "ConfigMap" and added["metadata"]["namespace"] == "models"
    assert added["metadata"]["name"].startswith("tmaguard-wheel-") and list(added["binaryData"]) == [
        wheel.name
    ]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    _check_guarded(service["spec"]["predictor"], ["kserve-container"], added["metadata"]["name"], (digest,))
    (init,) = service["spec"]["predictor"]["initContainers"]
    assert init["env"] == [{"name": "TMAGUARD_WHEEL_SHA256", "value": digest}]
    assert render.schema_problems(added) == []
    other = release.wheels["aarch64"]
    moved = stream.split(guarded(after, "--wheel", str(other)))
    (init,) = next(d.value for d in moved if d.value["kind"] == "InferenceService")["spec"]["predictor"][
        "initContainers"
    ]
    moved_to = hashlib.sha256(other.read_bytes()).hexdigest()
    assert init["env"] == [{"name": "TMAGUARD_WHEEL_SHA256", "value": moved_to}]


def test_production_stack_values_give_the_same_install(stock_python, release, tmp_path) -> None:
    """deploy/helm/production-stack-values.yaml through the chart of its shape: the init container
    (initContainer, its own extraVolumeMounts), the volumes (extraVolumes), PYTHONPATH (env) and the mount
    (extraVolumeMounts) are the zero-image install's; the init container runs the model's own image and
    places the package."""
    values = yaml.safe_load((DEPLOY / "helm" / "production-stack-values.yaml").read_text())
    text = helm_template(CHARTS / "stack", values)
    (deployment,) = [
        d.value
        for d in stream.split(text)
        if d.value and d.value["kind"] == "Deployment" and "qwen" in str(d.value)
    ]
    pod = deployment["spec"]["template"]["spec"]
    (vllm,) = pod["containers"]
    (init,) = pod["initContainers"]
    expected = zero_image.init_container(vllm)
    assert init["image"] == vllm["image"] == "vllm/vllm-openai:v0.32.0"
    for key in ("name", "command", "args", "resources", "volumeMounts", "securityContext"):
        assert init[key] == expected[key], key
    assert pod["volumes"] == zero_image.volumes()
    assert {"name": "PYTHONPATH", "value": zero_image.PACKAGE_DIR} in vllm["env"]
    assert vllm["volumeMounts"] == [
        {"name": zero_image.PACKAGE_VOLUME, "mountPath": zero_image.PACKAGE_DIR, "readOnly": True}
    ]
    for document in stream.split(text):
        assert document.value is None or render.schema_problems(document.value) == []
    toggles = next(d.value for d in stream.split(text) if d.value and d.value["kind"] == "ConfigMap")
    assert toggles["data"]["TMAGUARD_MODE"] == "auto"
    assert vllm["envFrom"] == [{"configMapRef": {"name": toggles["metadata"]["name"]}}]

    printed = subprocess.run(
        [TMAGUARD, "wheel-configmap", str(release.wheels["x86_64"])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    volume = _configmap_volume(yaml.safe_load(printed.stdout), tmp_path / "configmap")
    package = tmp_path / "emptydir"
    package.mkdir(mode=0o777)
    done = run_init_container(init, volume, package, Path(stock_python).parent)
    assert done.returncode == 0, done.stderr
    assert (package / "sitecustomize.py").is_file()

    # The pin, as the values file's comment says to give it: the chart carries it to the init container,
    # which then places the wheel it pins and refuses another.
    pin = {"name": "TMAGUARD_WHEEL_SHA256", "value": printed.stderr.strip().rpartition("=")[2]}
    values["servingEngineSpec"]["modelSpec"][0]["initContainer"]["env"] = [pin]
    pinned_text = helm_template(CHARTS / "stack", values)
    pinned = next(
        d.value
        for d in stream.split(pinned_text)
        if d.value and d.value["kind"] == "Deployment" and "qwen" in str(d.value)
    )["spec"]["template"]["spec"]["initContainers"][0]
    assert pin in pinned["env"]
    forged = _forged(release.wheels["x86_64"], tmp_path / "forged.whl", tmp_path / "forged-code-ran")
    for wheel, status in ((release.wheels["x86_64"], 0), (forged, 1)):
        package, volume = tmp_path / f"pinned-{status}", tmp_path / f"configmap-{status}"
        package.mkdir(mode=0o777)
        volume.mkdir()
        (volume / "vllm-tmaguard.whl").write_bytes(wheel.read_bytes())
        done = run_init_container(pinned, volume, package, Path(stock_python).parent)
        assert done.returncode == status, done.stderr
        assert (package / "sitecustomize.py").is_file() == (status == 0)
        assert ("is not one that TMAGUARD_WHEEL_SHA256 pins" in done.stderr) == (status == 1)
    assert not (tmp_path / "forged-code-ran").exists()


@pytest.mark.parametrize("args", [["--nope"], ["--container"]])
def test_a_usage_error_is_exit_2(args) -> None:
    assert manifests("", *args).returncode == 2


def test_the_real_charts_script_runs_on_charts_of_their_shapes(capsys) -> None:
    """scripts/render_real_charts.py (a developer's script: the real charts are not in the repository) on the
    charts written here, with the real Helm (scripts/install_helm.sh), so that it does not rot between its
    runs: the production stack in both modes, vLLM's chart, llm-d's modelservice."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "render_real_charts", DEPLOY.parent / "scripts/render_real_charts.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--stack", str(CHARTS / "stack"), "--stack-commit", "test", "--vllm-chart",
                        str(CHARTS / "vllm"), "--vllm-commit", "test", "--llm-d-chart",
                        str(CHARTS / "modelservice"), "--llm-d-commit", "test"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.startswith("Rendered by Helm v4.1.4")
    assert printed.count("other kinds' pod specs as Pods): 0 problems") == 7, printed
    assert printed.count("a second run changed nothing; Helm 4's plugin gave the same objects") == 4
    assert "guarded Deployment/default/vllm-deployment-vllm spec.template.spec: vllm" in printed
    assert "RayCluster/default/vllm-qwen-raycluster spec.headGroupSpec.template.spec: init" in printed
    assert "(tmaguard-inject runs `/opt/vllm/bin/python3`)" in printed


SLICE = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: vllm}
spec:
  selector: {matchLabels: {app: vllm}}
  template:
    metadata: {labels: {app: vllm}}
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.32.0
          args: ["Qwen/Qwen3-8B", "--port", "8000"]
          resources:
            limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 8192}
"""


def test_a_gpu_memory_slice_gets_the_fraction_that_fits_it() -> None:
    """Issue 32: a chart that left vLLM's default fraction under HAMi's 8 GiB slice gets the value the guard
    would set (0.84); the chart's own value stands; a second run changes nothing."""
    after = guarded(SLICE)
    (changed,) = _changed(SLICE, after)
    (vllm,) = changed["spec"]["template"]["spec"]["containers"]
    assert vllm["args"] == ["Qwen/Qwen3-8B", "--port", "8000", "--gpu-memory-utilization", "0.84"]
    assert guarded(after) == after
    own = SLICE.replace('"8000"]', '"8000", "--gpu-memory-utilization", "0.5"]')
    (kept,) = _changed(own, guarded(own))
    assert kept["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "0.5"
