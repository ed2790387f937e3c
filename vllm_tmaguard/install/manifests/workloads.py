"""Where an object keeps its pod specs: the built-in workloads; LeaderWorkerSet's leader and worker templates
(without a leader template the worker template serves the leader) and DisaggregatedSet's roles of them;
KubeRay's RayCluster, RayService and RayJob (head and worker groups: their first container is the Ray node
KubeRay starts `ray start` in); KServe's InferenceService (predictor, its multi-node workerSpec),
ServingRuntime and ClusterServingRuntime (no init containers in their pod spec), LLMInferenceService and its
LLMInferenceServiceConfig fragments. A `kind: List` (kubectl get -o yaml) holds objects. Any other object that
holds containers is unknown here: postrender.py refuses it when one of its containers might run vLLM, rather
than miss a vLLM the guard should be in."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

# A pod spec's place in an object: the path to it ("*": each item of a list), whether the path ends at a pod
# template (metadata + spec) or at the pod spec itself (its annotations then the object's), and the role of
# the pods: RAY_NODE where KubeRay runs `ray start` in the first container.
TEMPLATE, INLINE = "template", "inline"
RAY_NODE = "ray-node"
# KServe's ServingRuntimePodSpec has containers and volumes but no initContainers (serving.kserve.io
# v1alpha1 servingruntime_types.go at kserve 0217bdab): the init container goes in the InferenceService.
NO_INIT = "no-init-containers"


class Place(NamedTuple):
    path: tuple[str, ...]
    shape: str = TEMPLATE
    role: str = ""


_TEMPLATE = Place(("spec", "template"))
_LWS = ("leaderWorkerTemplate",)
_LEADER_WORKER = (Place(("leaderTemplate",)), Place(("workerTemplate",)))
_RAY_GROUPS = (Place(("headGroupSpec", "template"), role=RAY_NODE),
               Place(("workerGroupSpecs", "*", "template"), role=RAY_NODE))  # fmt: skip
_LLM_SPECS = tuple(
    Place(("spec", *path), INLINE)
    for path in (("template",), ("worker",), ("prefill", "template"), ("prefill", "worker"))
)
_RUNTIME = (Place(("spec",), INLINE, NO_INIT), Place(("spec", "workerSpec"), INLINE, NO_INIT))


def _under(prefix: tuple[str, ...], places: tuple[Place, ...]) -> tuple[Place, ...]:
    return tuple(p._replace(path=(*prefix, *p.path)) for p in places)


# kind -> (the API group it must come from, or "" for the built-in ones; the places of its pod specs)
KINDS: dict[str, tuple[str, tuple[Place, ...]]] = {
    "Deployment": ("", (_TEMPLATE,)),
    "StatefulSet": ("", (_TEMPLATE,)),
    "DaemonSet": ("", (_TEMPLATE,)),
    "ReplicaSet": ("", (_TEMPLATE,)),
    "ReplicationController": ("", (_TEMPLATE,)),
    "Job": ("", (_TEMPLATE,)),
    "PodTemplate": ("", (Place(("template",)),)),
    "CronJob": ("", (Place(("spec", "jobTemplate", "spec", "template")),)),
    "LeaderWorkerSet": (
        "leaderworkerset.x-k8s.io",
        _under(("spec", *_LWS), _LEADER_WORKER),
    ),
    "DisaggregatedSet": (
        "disaggregatedset.x-k8s.io",
        _under(("spec", "roles", "*", "spec", *_LWS), _LEADER_WORKER),
    ),
    "RayCluster": ("ray.io", _under(("spec",), _RAY_GROUPS)),
    "RayService": ("ray.io", _under(("spec", "rayClusterConfig"), _RAY_GROUPS)),
    # The submitter pod (spec.submitterPodTemplate) runs `ray job submit`; the job's driver runs on the head.
    "RayJob": ("ray.io", _under(("spec", "rayClusterSpec"), _RAY_GROUPS)),
    "InferenceService": (
        "serving.kserve.io",
        tuple(
            Place(("spec", *p), INLINE)
            for p in (("predictor",), ("predictor", "workerSpec"), ("transformer",), ("explainer",))
        ),
    ),
    "ServingRuntime": ("serving.kserve.io", _RUNTIME),
    "ClusterServingRuntime": ("serving.kserve.io", _RUNTIME),
    "LLMInferenceService": ("serving.kserve.io", _LLM_SPECS),
    "LLMInferenceServiceConfig": ("serving.kserve.io", _LLM_SPECS),
}
RAY_KINDS = ("RayCluster", "RayService", "RayJob")


class PodSpec(NamedTuple):
    where: str  # e.g. "Deployment/vllm spec.template.spec"
    spec: dict[str, Any]  # the pod spec itself, edited in place
    annotations: dict[str, Any]  # its pod template's annotations (the object's own, for an inline spec)
    role: str = ""  # RAY_NODE, NO_INIT or ""
    shape: str = TEMPLATE


def describe(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    namespace = f"{metadata['namespace']}/" if metadata.get("namespace") else ""
    return f"{obj.get('kind', '?')}/{namespace}{metadata.get('name', '?')}"


def _walk(value: Any, path: tuple[str, ...], where: str = "") -> Iterator[tuple[str, Any]]:
    """(where, value) for each value at `path` under `value`, "*" taking each item of a list."""
    if not path:
        yield where, value
        return
    key, rest = path[0], path[1:]
    if key == "*":
        for index, item in enumerate(value if isinstance(value, list) else []):
            yield from _walk(item, rest, f"{where}[{index}]")
    elif isinstance(value, dict) and key in value:
        yield from _walk(value[key], rest, f"{where}.{key}" if where else key)


def _group(obj: dict[str, Any]) -> str:
    return str(obj.get("apiVersion", "")).partition("/")[0] if "/" in str(obj.get("apiVersion", "")) else ""


def known(obj: dict[str, Any]) -> bool:
    kind = obj.get("kind")
    if kind == "Pod":
        return True
    group = KINDS[kind][0] if isinstance(kind, str) and kind in KINDS else None
    return group is not None and (group == "" or _group(obj) == group)


def pod_specs(obj: dict[str, Any]) -> list[PodSpec] | None:
    """The pod specs of `obj` (empty when it has none); None for a kind not known here."""
    if obj.get("kind") == "Pod":
        spec = obj.get("spec")
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return [PodSpec(f"{describe(obj)} spec", spec, annotations)] if isinstance(spec, dict) else []
    if not known(obj):
        return None
    own = (obj.get("metadata") or {}).get("annotations") or {}
    found = []
    for place in KINDS[str(obj["kind"])][1]:
        for where, value in _walk(obj, place.path):
            if place.shape == TEMPLATE:
                spec, annotations = _at(value, ("spec",)), _at(value, ("metadata", "annotations")) or {}
                where += ".spec"
            else:
                spec, annotations = value, own
            if isinstance(spec, dict) and isinstance(annotations, dict):
                found.append(PodSpec(f"{describe(obj)} {where}", spec, annotations, place.role, place.shape))
    return found


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def ray_job_text(obj: dict[str, Any]) -> str:
    """What a KubeRay object runs besides its pods' commands: a RayJob's entrypoint and runtime env, a
    RayService's Serve config (Ray Serve LLM applications run vLLM in Ray actors)."""
    spec = obj.get("spec") if obj.get("kind") in RAY_KINDS and isinstance(obj.get("spec"), dict) else {}
    parts = [spec.get(key) for key in ("entrypoint", "runtimeEnvYAML", "serveConfigV2")]
    return "\n".join(part for part in parts if isinstance(part, str))


def runtime_name(obj: dict[str, Any]) -> str | None:
    """The ServingRuntime an InferenceService's predictor names (spec.predictor.model.runtime)."""
    if obj.get("kind") != "InferenceService" or _group(obj) != "serving.kserve.io":
        return None
    name = _at(obj, ("spec", "predictor", "model", "runtime"))
    return name if isinstance(name, str) and name else None


def containers_anywhere(value: Any) -> Iterator[dict[str, Any]]:
    """Every mapping under `value` that looks like a container (a name and an image) inside a list named
    containers or initContainers: what an unknown kind might run."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("containers", "initContainers") and isinstance(item, list):
                yield from (c for c in item if isinstance(c, dict) and "image" in c)
            else:
                yield from containers_anywhere(item)
    elif isinstance(value, list):
        for item in value:
            yield from containers_anywhere(item)
