"""`tmaguard manifests`: a YAML stream (helm template, a Helm post-renderer's input, kubectl get -o yaml, a
kustomize build) with the zero-image install added to every pod that runs vLLM. Documents it does not
change are written back byte for byte; a second run changes nothing. Anything it cannot tell (which
container runs vLLM, where an unknown kind keeps its pods) refuses the whole stream with what to name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..wheel import sha256
from . import configmap, detect, stream, workloads, zero_image

HOW_TO_NAME = (
    f'name the containers that run vLLM: the pod template\'s annotation {detect.ANNOTATION}: "NAME[,NAME]" '
    '("" for none), or --container NAME (only the containers so named, in every pod)'
)


@dataclass
class Result:
    text: str = ""
    guarded: list[str] = field(default_factory=list)  # "<where>: <container>, ..."
    refused: list[str] = field(default_factory=list)  # "<where>: <why>"


def _suspicious(obj: dict[str, Any], named: Sequence[str]) -> list[str]:
    names = []
    for container in workloads.containers_anywhere(obj):
        text = " ".join(map(str, [container.get("image", ""), *(container.get("command") or [])]))
        text += " " + " ".join(map(str, container.get("args") or []))
        if container.get("name") in named or "vllm" in text.lower():
            names.append(str(container.get("name")))
    return names


def _guard_object(
    obj: dict[str, Any], named: Sequence[str], wheel_configmap: str, pins: tuple[str, ...], result: Result
) -> bool:
    specs = workloads.pod_specs(obj)
    if specs is None:
        if suspicious := _suspicious(obj, named):
            result.refused.append(
                f"{workloads.describe(obj)}: containers {suspicious} may run vLLM, in a kind whose pod spec "
                "this command does not know; add the guard to it by hand (docs/operator.md, zero image)"
            )
        return False
    changed = False
    for pod in specs:
        verdict = detect.vllm_containers(pod.spec, pod.annotations, named)
        if verdict.unclear:
            result.refused += [f"{pod.where}: container {why}" for why in verdict.unclear]
            continue
        vllm = [c for c in pod.spec.get("containers") or [] if c.get("name") in verdict.runs_vllm]
        if not vllm:
            continue
        try:
            for container in vllm:
                changed |= zero_image.ensure_container(container)
        except ValueError as error:
            result.refused.append(f"{pod.where}: {error}")
            continue
        changed |= zero_image.ensure_pod(pod.spec, vllm[0], wheel_configmap, pins)
        result.guarded.append(f"{pod.where}: {', '.join(verdict.runs_vllm)}")
    return changed


def _objects(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, dict):
        return []
    items = value.get("items")
    if str(value.get("kind", "")).endswith("List") and isinstance(items, list):
        return [item for item in items if isinstance(item, dict)]
    return [value]


def postrender(text: str, named: Sequence[str] = (), wheels: Mapping[str, bytes] | None = None) -> Result:
    """The stream with the guard added; `wheels` ({file name: bytes}): a ConfigMap of them added to the
    stream (one per namespace of the guarded pods), mounted, and the init container pinned to their sha256;
    else the pods mount the `tmaguard-wheel` ConfigMap made by `tmaguard wheel-configmap`. Raises
    stream.StreamError, ValueError (wheels too large)."""
    result = Result()
    documents = stream.split(text)
    pins = tuple(sha256(data) for data in (wheels or {}).values())
    wheel_cm = configmap.wheel_configmap(zero_image.WHEEL_CONFIGMAP, wheels) if wheels else None
    wheel_name = wheel_cm["metadata"]["name"] if wheel_cm else zero_image.WHEEL_CONFIGMAP
    namespaces: dict[str | None, None] = {}
    existing: set[tuple[str | None, str]] = set()
    out = []
    for document in documents:
        changed = False
        for obj in _objects(document.value):
            namespace = (obj.get("metadata") or {}).get("namespace")
            if obj.get("kind") == "ConfigMap":
                existing.add((namespace, (obj.get("metadata") or {}).get("name")))
            before = len(result.guarded)
            changed |= _guard_object(obj, named, wheel_name, pins, result)
            if len(result.guarded) > before:
                namespaces[namespace] = None
        out.append(stream.rewrite(document, document.value) if changed else document.text)
    if not result.guarded and not result.refused:
        result.refused.append(f"no container runs vLLM here (by its image or command): {HOW_TO_NAME}")
    if result.refused:
        return result
    if wheel_cm is not None:
        for namespace in namespaces:
            if (namespace, wheel_name) not in existing:
                added = configmap.wheel_configmap(zero_image.WHEEL_CONFIGMAP, wheels or {}, namespace)
                if out and not out[-1].endswith("\n"):
                    out[-1] += "\n"
                out.append("---\n" + stream.dump(added))
    result.text = "".join(out)
    return result
