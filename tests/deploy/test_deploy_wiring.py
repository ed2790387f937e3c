"""What the schemas cannot see: references between objects, the probes, the termination message, GPUs
against tensor parallelism, the TMAGUARD_* toggles against the code that parses them, the operator docs."""

from __future__ import annotations

import math
import re

import pytest
from deploykit import KUSTOMIZATIONS, OPERATOR_DOC, find, render, vllm_container

from vllm_tmaguard.stages.toggles import TOGGLES, ToggleError, parse_toggles


def _http_port(container: dict, port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p["name"] == port)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_deployment_is_wired_as_the_docs_say(rendered, name) -> None:
    objects = rendered[name]
    deployment = find(objects, "Deployment", "vllm")
    pod = deployment["spec"]["template"]["spec"]
    container = vllm_container(objects)
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}

    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert pod["enableServiceLinks"] is False
    if name.endswith("stock-image"):  # vLLM's own image; the package placed by an init container
        assert container["image"] == "vllm/vllm-openai:v0.32.0"
        (inject,) = pod["initContainers"]
        assert inject["image"] == container["image"]  # the same image: no image of ours
        assert inject["args"] == ["inject", "--wheel", "/opt/tmaguard-wheel", "/opt/vllm-tmaguard"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PYTHONPATH"] == "/opt/vllm-tmaguard"
        mounts = [
            next(m for m in c["volumeMounts"] if m["mountPath"] == "/opt/vllm-tmaguard")
            for c in (inject, container)
        ]
        assert mounts[0]["name"] == mounts[1]["name"] and mounts[1]["readOnly"] is True
        assert "nvidia.com/gpu" not in str(inject.get("resources"))  # no GPU, no layer: it copies files
        volumes = {v["name"]: v for v in pod["volumes"]}
        wheel_mount = next(m for m in inject["volumeMounts"] if m["mountPath"] == "/opt/tmaguard-wheel")
        wheel_map = find(objects, "ConfigMap", volumes[wheel_mount["name"]]["configMap"]["name"])
        assert list(wheel_map["binaryData"]) == ["vllm-tmaguard.whl"] and wheel_mount["readOnly"] is True
    else:
        assert "initContainers" not in pod
        assert container["image"] == "registry.example.com/vllm-tmaguard:v0.32.0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/health" and _http_port(container, get["port"]) == 8000, probe
        assert container[probe].get("timeoutSeconds", 1) >= 5, probe  # kubelet's default is 1 s
    assert container["command"] == ["/bin/sh", "/etc/tmaguard/preflight.sh"]
    assert "--port=8000" in container["args"] and "--host=0.0.0.0" in container["args"]

    # kubelet expands $(VAR) in command and args only for variables the container defines.
    defined = {e["name"] for e in container["env"]}
    for source in container["envFrom"]:
        defined |= set(configmaps[source["configMapRef"]["name"]])
    used = {m for arg in container["command"] + container["args"] for m in re.findall(r"\$\((\w+)\)", arg)}
    assert used and used <= defined, used - defined
    for env in container["env"]:
        ref = env.get("valueFrom", {}).get("configMapKeyRef")
        if ref and not ref.get("optional"):
            assert ref["key"] in configmaps[ref["name"]], ref
    assert {"configMapRef": {"name": "tmaguard-toggles"}} in container["envFrom"]

    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            assert volume["configMap"]["name"] in configmaps
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert "emptyDir" in volumes[mounts[configmaps["tmaguard-toggles"]["TMAGUARD_RECORD_DIR"]]]
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert volumes[mounts["/etc/tmaguard"]]["configMap"]["name"] == "tmaguard-preflight"

    service = find(objects, "Service", "vllm-api")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert _http_port(container, service["spec"]["ports"][0]["targetPort"]) == 8000


def _gpus(limits: dict) -> int:
    if "tencent.com/vcuda-core" in limits:
        return math.ceil(int(limits["tencent.com/vcuda-core"]) / 100)
    return int(limits["nvidia.com/gpu"])


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_gpu_requests_match_tensor_parallelism_and_the_layer(rendered, name) -> None:
    objects = rendered[name]
    container = vllm_container(objects)
    limits = container["resources"]["limits"]
    tp = int(find(objects, "ConfigMap", "vllm-server")["data"]["TENSOR_PARALLEL_SIZE"])
    assert _gpus(limits) == tp
    assert all(str(v).isdigit() for k, v in limits.items() if "/" in k), limits  # extended: whole numbers
    env = {e["name"]: e.get("value") for e in container["env"]}
    if "nvidia.com/gpumem" in limits and tp > 1:  # HAMi with tensor parallelism
        assert "--disable-custom-all-reduce" in container["args"]
        assert env["NCCL_CUMEM_HOST_ENABLE"] == "0"
    if "tencent.com/vcuda-core" in limits:
        # Share mode (< 100 cores) is when gpu-manager mounts the vCUDA layer; and then the env recipe.
        assert int(limits["tencent.com/vcuda-core"]) < 100 and "nvidia.com/gpu" not in limits
        overlay_dir = env["PREFLIGHT_OVERLAY_DIR"]
        assert env["LD_LIBRARY_PATH"].split(":")[0] == overlay_dir
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == overlay_dir)
        pod = find(objects, "Deployment", "vllm")["spec"]["template"]["spec"]
        assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == mount["name"])
    expected = {
        "base": "nvidia.com/gpu",
        "overlays/hami": "nvidia.com/gpumem",
        "overlays/vcuda": "tencent.com/vcuda-core",
        "overlays/vcuda-stock-image": "tencent.com/vcuda-core",
    }
    assert expected[name] in limits


# --- toggles ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_the_toggles_configmap_holds_known_toggles_with_allowed_values(rendered, name) -> None:
    data = find(rendered[name], "ConfigMap", "tmaguard-toggles")["data"]
    specs = {spec.name: spec for spec in TOGGLES}
    assert data and all(key in specs for key in data), set(data) - set(specs)
    for key, value in data.items():
        assert not specs[key].allowed or value in specs[key].allowed, (key, value)
    parsed = parse_toggles(data)  # raises ToggleError on a bad value, as the guard would refuse it
    assert (parsed.mode, parsed.strict, parsed.record_dir) == ("auto", False, data["TMAGUARD_RECORD_DIR"])
    with pytest.raises(ToggleError, match="TMAGUARD_GEMM"):
        parse_toggles({**data, "TMAGUARD_GEMM": "fast"})
    # Only the toggles ConfigMap and the manifests' own variables: no stray TMAGUARD_* names elsewhere.
    container = vllm_container(rendered[name])
    assert not [e["name"] for e in container["env"] if e["name"].startswith("TMAGUARD_")]


def _doc_table() -> str:
    text = OPERATOR_DOC.read_text()
    begin, end = text.index(render.TOGGLES_BEGIN), text.index(render.TOGGLES_END)
    return text[begin + len(render.TOGGLES_BEGIN) : end].strip()


def test_the_operator_docs_toggles_table_is_the_one_the_code_generates() -> None:
    assert _doc_table() == render.toggles_table(), (
        "docs/operator.md's toggles table differs from vllm_tmaguard.stages.toggles.TOGGLES; "
        "regenerate it with `python deploy/render.py toggles-table`"
    )
    # Independently of the generator: every row says what the spec says, in the spec's order.
    rows = [line.split(" | ") for line in _doc_table().splitlines()[2:]]
    assert [row[0].strip("| `") for row in rows] == [spec.name for spec in TOGGLES]
    for row, spec in zip(rows, TOGGLES, strict=True):
        values = [v.strip("`") for v in row[1].split(", ")] if spec.allowed else [row[1]]
        assert values == (list(spec.allowed) or [spec.kind]), spec.name
        assert row[2] == f"`{spec.default}`" and row[3].rstrip(" |").replace("\\|", "|") == spec.effect


def test_the_operator_docs_cover_the_error_strings_users_paste() -> None:
    text = OPERATOR_DOC.read_text()
    for error in (
        "undefined symbol: cuTensorMapEncodeTiled",
        "undefined symbol: cuGetProcAddress_v2",
        "CUBLAS_STATUS_NOT_INITIALIZED",
        "Segmentation fault",
        "an illegal instruction was encountered",
        "Failed to retrieve cuTensorMapEncodeTiled from libcuda.so.1",
        "Illegal device id",
        "--disable-custom-all-reduce",
        "appears to be a URI",
        "kubectl debug",
        "kubectl apply -k deploy/k8s/overlays/vcuda",
    ):
        assert error in text, error
