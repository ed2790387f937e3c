"""`tmaguard manifests` on every multi-node shape operators deploy vLLM with (tests/deploy/shapes, each naming
the source it follows): LeaderWorkerSet with and without a leader template, DisaggregatedSet, KubeRay's
RayCluster, RayService and RayJob, KServe's InferenceService with a workerSpec, ServingRuntime with the
InferenceService that uses it, LLMInferenceService. Run in this process (pure Python: PyYAML and the package's
manifests code), each stream twice: every pod that runs vLLM or hosts its Ray workers gets the zero-image
install, every other pod and document stays as it was, a second run changes nothing, the guarded pod specs
validate as Pods; what cannot be told is refused, saying how to name it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from deploykit import render

from vllm_tmaguard.install.manifests import postrender, stream, workloads, zero_image

SHAPES = Path(__file__).resolve().parent / "shapes"


def guarded(text: str, named: tuple[str, ...] = (), python: str | None = None) -> postrender.Result:
    result = postrender.postrender(text, named, None, python)
    assert not result.refused, result.refused
    again = postrender.postrender(result.text, named, None, python)
    assert again.text == result.text and not again.refused  # a second run changes nothing
    return result


def _pods(text: str) -> dict[str, dict]:
    """Every pod spec of the stream by its place ("Kind/name path"), parsed."""
    found = {}
    for document in stream.split(text):
        if isinstance(document.value, dict):
            for pod in workloads.pod_specs(document.value) or []:
                found[pod.where] = pod.spec
    return found


def _check(pod: dict, names: list[str], python: str = "python3", init: bool = True) -> None:
    vllm = [c for c in pod["containers"] if c["name"] in names]
    assert [c["name"] for c in vllm] == names
    if init:
        assert pod["initContainers"][0] == zero_image.init_container(vllm[0], python=python)
        assert pod["initContainers"][0]["command"][0] == python
    else:
        assert "initContainers" not in pod
    assert [v for v in pod["volumes"] if v["name"].startswith("tmaguard-")] == zero_image.volumes()
    for container in vllm:
        assert {"name": "PYTHONPATH", "value": zero_image.PACKAGE_DIR} in container["env"]
        assert {"name": zero_image.PACKAGE_VOLUME, "mountPath": zero_image.PACKAGE_DIR, "readOnly": True} in (
            container["volumeMounts"]
        )
        assert {"configMapRef": {"name": "tmaguard-toggles", "optional": True}} in container["envFrom"]
    assert _pod_problems(pod) == []


def _pod_problems(pod: dict) -> list:
    """The pod spec's containers and volumes validated as a Pod's, against Kubernetes 1.37 (the sources'
    native sidecar init containers, restartPolicy: Always, are newer than 1.25)."""
    spec = {k: v for k, v in pod.items() if k in ("containers", "initContainers", "volumes")}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": spec}
    return render.schema_problems(pod, ("1.37",))


# shape -> {pod place: (containers that get the guard, the Python its init container runs)}; every other pod
# place of the shape must come back unchanged.
EXPECTED = {
    "lws.yaml": {
        "LeaderWorkerSet/vllm spec.leaderWorkerTemplate.leaderTemplate.spec": ["vllm-leader"],
        "LeaderWorkerSet/vllm spec.leaderWorkerTemplate.workerTemplate.spec": ["vllm-worker"],
    },
    "lws-llm-d.yaml": {
        "LeaderWorkerSet/wide-ep-decode spec.leaderWorkerTemplate.workerTemplate.spec": ["vllm-worker"],
    },
    "disaggregatedset.yaml": {
        "DisaggregatedSet/wide-ep spec.roles[0].spec.leaderWorkerTemplate.workerTemplate.spec": ["vllm"],
        "DisaggregatedSet/wide-ep spec.roles[1].spec.leaderWorkerTemplate.leaderTemplate.spec": ["vllm"],
        "DisaggregatedSet/wide-ep spec.roles[1].spec.leaderWorkerTemplate.workerTemplate.spec": ["vllm"],
    },
    "raycluster.yaml": {
        "RayCluster/vllm spec.headGroupSpec.template.spec": ["ray-head"],
        "RayCluster/vllm spec.workerGroupSpecs[0].template.spec": ["ray-worker"],
    },
    "rayjob.yaml": {
        "RayJob/batch spec.rayClusterSpec.headGroupSpec.template.spec": ["ray-head"],
        "RayJob/batch spec.rayClusterSpec.workerGroupSpecs[0].template.spec": ["ray-worker"],
    },
    "kserve-workerspec.yaml": {
        "InferenceService/models/qwen-multinode spec.predictor": ["kserve-container"],
        "InferenceService/models/qwen-multinode spec.predictor.workerSpec": ["worker-container"],
    },
    "llmisvc.yaml": {
        f"LLMInferenceService/models/deepseek spec.{place}": ["main"]
        for place in ("template", "worker", "prefill.template", "prefill.worker")
    },
}
PYTHONS = {"lws-llm-d.yaml": "/opt/vllm/bin/python3"}  # `source /opt/vllm/bin/activate; exec vllm serve`


@pytest.mark.parametrize("shape", sorted(EXPECTED))
def test_each_shape_guards_its_vllm_pods_and_leaves_the_rest(shape: str) -> None:
    before = (SHAPES / shape).read_text()
    result = guarded(before)
    assert sorted(w.rpartition(":")[0] for w in result.guarded) == sorted(EXPECTED[shape])
    old, new = _pods(before), _pods(result.text)
    assert old.keys() == new.keys()
    for where, pod in new.items():
        if where in EXPECTED[shape]:
            _check(pod, EXPECTED[shape][where], PYTHONS.get(shape, "python3"))
            others = [c for c in pod["containers"] if c["name"] not in EXPECTED[shape][where]]
            assert others == [c for c in old[where]["containers"] if c["name"] not in EXPECTED[shape][where]]
            assert pod["initContainers"][1:] == old[where].get(
                "initContainers", []
            )  # the chart's, after ours
        else:
            assert pod == old[where], where
    # Everything outside the pod specs stays as it was.
    for a, b in zip(stream.split(before), stream.split(result.text), strict=True):
        if a.text == b.text:
            continue
        stripped = [copy.deepcopy(d.value) for d in (a, b)]
        for value in stripped:
            for pod in workloads.pod_specs(value) or []:
                pod.spec.clear()
        assert stripped[0] == stripped[1]


def test_the_shapes_follow_their_sources_where_the_guard_cares() -> None:
    """What the expectations rest on: KubeRay's Ray container is the first, LWS's llm-d shape has no leader
    template, the RayJob's submitter is not a pod place, the llm-d container activates /opt/vllm."""
    lws = yaml.safe_load((SHAPES / "lws-llm-d.yaml").read_text())
    assert "leaderTemplate" not in lws["spec"]["leaderWorkerTemplate"]
    assert (
        "source /opt/vllm/bin/activate"
        in lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"][0]
    )
    job = yaml.safe_load((SHAPES / "rayjob.yaml").read_text())
    assert not any("submitter" in p.where for p in workloads.pod_specs(job))
    assert [p.role for p in workloads.pod_specs(job)] == [workloads.RAY_NODE] * 2


def test_the_ray_job_submitter_and_a_sidecar_are_left_alone() -> None:
    result = guarded((SHAPES / "rayjob.yaml").read_text())
    job = next(d.value for d in stream.split(result.text) if d.value)
    original = yaml.safe_load((SHAPES / "rayjob.yaml").read_text())
    assert job["spec"]["submitterPodTemplate"] == original["spec"]["submitterPodTemplate"]
    cluster = next(d.value for d in stream.split(guarded((SHAPES / "raycluster.yaml").read_text()).text))
    (sidecar,) = [
        c
        for c in cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
        if c["name"] == "fluentbit"
    ]
    assert sidecar == {"name": "fluentbit", "image": "fluent/fluent-bit:3.2"}


def test_a_ray_node_in_another_image_is_refused_until_named() -> None:
    """KubeRay's vLLM RayService sample installs vLLM at run time in Ray's image: its nodes may host vLLM's
    workers, but nothing in their image says so, and the init container needs vLLM's Python there. Refused,
    saying how to name them; named, they get the guard. A CPU group in Ray's image beside vLLM's groups the
    same, until its pod template names none."""
    service = (SHAPES / "rayservice.yaml").read_text()
    refused = postrender.postrender(service)
    assert len(refused.refused) == 2 and refused.text == ""
    assert all("not an image vLLM runs in here" in why and "names vLLM" in why for why in refused.refused)
    assert "spec.rayClusterConfig.workerGroupSpecs[0].template.spec: container llm:" in refused.refused[1]
    obj = yaml.safe_load(service)
    cluster = obj["spec"]["rayClusterConfig"]
    for template, name in ((cluster["headGroupSpec"]["template"], "ray-head"),
                           (cluster["workerGroupSpecs"][0]["template"], "llm")):  # fmt: skip
        template["metadata"] = {"annotations": {"vllm-tmaguard/containers": name}}
    named = guarded(stream.dump(obj))
    assert len(named.guarded) == 2

    cluster = yaml.safe_load((SHAPES / "raycluster.yaml").read_text())
    ray_image = {"name": "ray-worker", "image": "rayproject/ray:2.60.0"}
    cpu = {
        "groupName": "cpu",
        "replicas": 1,
        "rayStartParams": {},
        "template": {"spec": {"containers": [ray_image]}},
    }
    cluster["spec"]["workerGroupSpecs"].append(cpu)
    mixed = postrender.postrender(stream.dump(cluster))
    (why,) = mixed.refused
    assert "workerGroupSpecs[1]" in why and "runs vLLM in ['vllm/vllm-openai:v0.32.0']" in why
    cpu["template"]["metadata"] = {"annotations": {"vllm-tmaguard/containers": ""}}
    result = guarded(stream.dump(cluster))
    assert len(result.guarded) == 2
    assert next(d.value for d in stream.split(result.text))["spec"]["workerGroupSpecs"][1] == cpu


def test_kserve_runtime_gets_its_pieces_and_the_inference_service_its_init_container() -> None:
    """KServe's multi-node runtime runs its Hugging Face server (vLLM behind it): refused until named. Named
    (the runtime's annotation, over both its pod specs), the runtime's containers get PYTHONPATH, the mount
    and the toggles and its pod specs the volumes, but no init container (a ServingRuntime has none); the
    InferenceService that names the runtime gets it, in the runtime's image, in its predictor and its
    workerSpec; another InferenceService stays byte for byte."""
    before = (SHAPES / "kserve-multinode.yaml").read_text()
    refused = postrender.postrender(before)
    assert [why.split(": ")[0] for why in refused.refused] == [
        "ServingRuntime/models/kserve-huggingfaceserver-multinode spec",
        "ServingRuntime/models/kserve-huggingfaceserver-multinode spec.workerSpec",
    ]
    assert "KServe's Hugging Face server" in refused.refused[0]
    runtime, *_ = [d.value for d in stream.split(before)]
    runtime["metadata"]["annotations"] = {"vllm-tmaguard/containers": "kserve-container,worker-container"}
    text = stream.dump(runtime) + "---\n" + before.split("---\n", 1)[1]
    result = guarded(text)
    pods = _pods(result.text)
    _check(
        pods["ServingRuntime/models/kserve-huggingfaceserver-multinode spec"],
        ["kserve-container"],
        init=False,
    )
    _check(
        pods["ServingRuntime/models/kserve-huggingfaceserver-multinode spec.workerSpec"],
        ["worker-container"],
        init=False,
    )
    llama = pods["InferenceService/models/llama spec.predictor"]
    image = "kserve/huggingfaceserver:v0.16.0"
    (init,) = llama["initContainers"]
    assert init == zero_image.init_container({"image": image})
    (worker_init,) = llama["workerSpec"]["initContainers"]
    assert worker_init == zero_image.init_container({"image": image})
    assert [v for v in llama["volumes"] if v["name"].startswith("tmaguard-")] == zero_image.volumes()
    kept = [
        a.text for a, b in zip(stream.split(text), stream.split(result.text), strict=True) if a.text == b.text
    ]
    assert len(kept) == 1 and "sklearn" in kept[0]
    assert any(
        "the init container for runtime kserve-huggingfaceserver-multinode" in w for w in result.guarded
    )


def test_a_name_that_matches_no_container_is_refused() -> None:
    """A typo in the annotation or in --container leaves a vLLM unguarded: refused, naming the pod's
    containers (issue 34)."""
    lws = yaml.safe_load((SHAPES / "lws.yaml").read_text())
    lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"] = {
        "annotations": {"vllm-tmaguard/containers": "vllm-workr"}
    }
    (why,) = postrender.postrender(stream.dump(lws)).refused
    assert (
        "workerTemplate.spec: container vllm-workr: named by vllm-tmaguard/containers, no such container"
        in why
    )
    assert "['vllm-worker']" in why
    text = (SHAPES / "lws.yaml").read_text()
    (why,) = postrender.postrender(text, ("vllm-leader", "vllm-workr")).refused
    assert why.startswith("--container vllm-workr: no container so named")
    assert len(guarded(text, ("vllm-leader", "vllm-worker")).guarded) == 2


VENV = "/opt/vllm/bin/python3"
LLM_D_SCRIPT = "if [ -f /opt/vllm/bin/activate ]; then\n  . /opt/vllm/bin/activate\nfi\nexec vllm serve m"


@pytest.mark.parametrize(
    ("command", "args", "python"),
    [
        (["/bin/bash", "-c"], ["source /opt/vllm/bin/activate; exec vllm serve m --headless"], VENV),
        (["sh", "-c", LLM_D_SCRIPT], [], VENV),
        (["/opt/venv/bin/vllm", "serve"], ["m"], "/opt/venv/bin/python3"),
        (["/usr/bin/python3.12", "-m", "vllm.entrypoints.openai.api_server"], [], "/usr/bin/python3.12"),
        (["vllm", "serve"], ["m"], "python3"),
        (["sh", "-c", "cp /entrypoint/x.sh $HOME/x.sh && $HOME/x.sh &"], [], "python3"),
        (None, ["--model", "m"], "python3"),
    ],
)  # fmt: skip
def test_the_init_container_runs_the_python_that_runs_vllm(command, args, python) -> None:
    container = {"name": "vllm", "image": "ghcr.io/llm-d/llm-d-cuda:v0.4.0", "args": args}
    if command:
        container["command"] = command
    assert zero_image.interpreter(container) == python
    assert zero_image.init_container(container)["command"][:3] == [python, "-I", "-c"]


def test_python_named_by_the_flag_wins_and_moves() -> None:
    text = (SHAPES / "lws-llm-d.yaml").read_text()
    first = guarded(text, python="/usr/local/bin/python3.12").text
    (pod,) = _pods(first).values()
    assert pod["initContainers"][0]["command"][0] == "/usr/local/bin/python3.12"
    moved = guarded(first, python="/opt/vllm/bin/python3").text
    (pod,) = _pods(moved).values()
    assert pod["initContainers"][0]["command"][0] == "/opt/vllm/bin/python3"
    assert [c["name"] for c in pod["initContainers"]] == ["tmaguard-inject", "routing-proxy"]


def _as_kuberay_worker(template: dict, head: str = "vllm-head-svc.default.svc.cluster.local") -> dict:
    """The worker pod KubeRay builds from a worker group's template (ray-project/kuberay ray-operator/
    controllers/ray/common/pod.go, feeaf72f: DefaultWorkerPodTemplate, BuildPod): the wait-gcs-ready init
    container appended, in the Ray container's image, with a deep copy of its env and volume mounts; the Ray
    container's command replaced by `/bin/bash -lc --` and `ray start`."""
    pod = copy.deepcopy(template["spec"])
    ray = pod["containers"][0]
    wait = {
        "name": "wait-gcs-ready",
        "image": ray["image"],
        "command": ["/bin/bash", "-lc", "--"],
        "args": [f"until ray health-check --address {head}:6379 > /dev/null 2>&1; do sleep 5; done"],
        "env": copy.deepcopy(ray.get("env")),
        "volumeMounts": copy.deepcopy(ray.get("volumeMounts")),
        "resources": {
            "limits": {"cpu": "200m", "memory": "256Mi"},
            "requests": {"cpu": "200m", "memory": "256Mi"},
        },
    }
    pod.setdefault("initContainers", []).append(wait)
    ray["command"] = ["/bin/bash", "-lc", "--"]
    ray["args"] = [
        f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; ray start --address={head}:6379 --block"
    ]
    return pod


def test_kuberays_injected_init_container_still_works() -> None:
    """KubeRay appends wait-gcs-ready after the template's init containers, copying the Ray container's env
    and mounts: it then runs after the package is placed, mounts a volume the pod has, and its Python (`ray
    health-check`) gets PYTHONPATH with the placed package, whose sitecustomize arms only an import hook that
    waits for `import vllm` (tests/test_no_rebuild.py runs that layout). The pod validates as a Pod."""
    result = guarded((SHAPES / "raycluster.yaml").read_text())
    cluster = next(d.value for d in stream.split(result.text))
    pod = _as_kuberay_worker(cluster["spec"]["workerGroupSpecs"][0]["template"])
    assert [c["name"] for c in pod["initContainers"]] == ["tmaguard-inject", "wait-gcs-ready"]
    wait = pod["initContainers"][1]
    volumes = {v["name"] for v in pod["volumes"]}
    assert {m["name"] for m in wait["volumeMounts"]} <= volumes
    assert {"name": zero_image.PACKAGE_VOLUME, "mountPath": zero_image.PACKAGE_DIR, "readOnly": True} in (
        wait["volumeMounts"]
    )
    assert wait["env"][-1] == {"name": "PYTHONPATH", "value": zero_image.PACKAGE_DIR}
    assert (
        render.schema_problems({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w"}, "spec": pod})
        == []
    )
