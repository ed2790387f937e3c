"""Where an object keeps its pod specs: the built-in workloads, LeaderWorkerSet's leader and worker templates
and a KServe InferenceService's predictor (a pod spec inline). A `kind: List` (kubectl get -o yaml) holds
objects. Any other object that holds containers is unknown here: postrender.py refuses it when one of its
containers might run vLLM, rather than miss a vLLM the guard should be in."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

_TEMPLATE = ("spec", "template")
# kind -> the path of each pod template (a mapping with metadata and spec) in it
TEMPLATES: dict[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (_TEMPLATE,),
    "StatefulSet": (_TEMPLATE,),
    "DaemonSet": (_TEMPLATE,),
    "ReplicaSet": (_TEMPLATE,),
    "ReplicationController": (_TEMPLATE,),
    "Job": (_TEMPLATE,),
    "PodTemplate": (("template",),),
    "CronJob": (("spec", "jobTemplate", "spec", "template"),),
    "LeaderWorkerSet": (
        ("spec", "leaderWorkerTemplate", "leaderTemplate"),
        ("spec", "leaderWorkerTemplate", "workerTemplate"),
    ),
}


class PodSpec(NamedTuple):
    where: str  # e.g. "Deployment/vllm spec.template.spec"
    spec: dict[str, Any]  # the pod spec itself, edited in place
    annotations: dict[str, Any]  # its pod template's annotations (the object's own, for a Pod)


def describe(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    namespace = f"{metadata['namespace']}/" if metadata.get("namespace") else ""
    return f"{obj.get('kind', '?')}/{namespace}{metadata.get('name', '?')}"


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def pod_specs(obj: dict[str, Any]) -> list[PodSpec] | None:
    """The pod specs of `obj` (empty when it has none); None for a kind not known here."""
    kind = obj.get("kind")
    if kind == "Pod":
        spec = obj.get("spec")
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return [PodSpec(f"{describe(obj)} spec", spec, annotations)] if isinstance(spec, dict) else []
    if kind == "InferenceService" and str(obj.get("apiVersion", "")).startswith("serving.kserve.io/"):
        predictor = _at(obj, ("spec", "predictor"))
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if isinstance(predictor, dict) and isinstance(predictor.get("containers"), list):
            return [PodSpec(f"{describe(obj)} spec.predictor", predictor, annotations)]
        return []
    if kind not in TEMPLATES:
        return None
    found = []
    for path in TEMPLATES[kind]:
        template = _at(obj, path)
        spec = _at(template, ("spec",))
        if isinstance(spec, dict):
            annotations = _at(template, ("metadata", "annotations")) or {}
            found.append(PodSpec(f"{describe(obj)} {'.'.join((*path, 'spec'))}", spec, annotations))
    return found


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
