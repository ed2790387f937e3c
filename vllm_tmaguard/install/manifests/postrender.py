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
from .memory_flag import fraction_args

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


def _group(obj: dict[str, Any], specs: list[workloads.PodSpec]) -> detect.Group:
    """What the object's Ray nodes join: the images its pods plainly run vLLM in, and whether its jobs name
    vLLM elsewhere (a RayJob's entrypoint or runtime env, a RayService's Serve config: Ray Serve LLM)."""
    containers = [c for pod in specs for c in pod.spec.get("containers") or [] if isinstance(c, dict)]
    images = frozenset(str(c.get("image", "")) for c in containers if detect.plainly_runs_vllm(c))
    jobs = workloads.ray_job_text(obj).lower()
    names = "its entrypoint, runtime env or Serve config" if "vllm" in jobs or "ray.serve.llm" in jobs else ""
    return detect.Group(images, names)


def _names(pods: list[workloads.PodSpec]) -> list[str]:
    containers = [c for pod in pods for c in pod.spec.get("containers") or [] if isinstance(c, dict)]
    return [str(c.get("name", "")) for c in containers]


@dataclass
class _Run:
    """What one postrender() run carries from object to object."""

    named: Sequence[str]
    wheel_configmap: str
    pins: tuple[str, ...]
    python: str | None
    result: Result
    matched: set[str] = field(default_factory=set)  # --container names found in some pod
    # ServingRuntime name -> {pod-spec place: its first vLLM container}, for the InferenceServices that use it
    runtimes: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)


def _guard_object(obj: dict[str, Any], run: _Run) -> bool:
    result = run.result
    specs = workloads.pod_specs(obj)
    if specs is None:
        if suspicious := _suspicious(obj, run.named):
            result.refused.append(
                f"{workloads.describe(obj)}: containers {suspicious} may run vLLM, in a kind whose pod spec "
                "this command does not know; add the guard to it by hand (docs/operator.md, zero image)"
            )
        return False
    group = _group(obj, specs)
    shared = _names([pod for pod in specs if pod.shape == workloads.INLINE])
    changed = False
    for pod in specs:
        ray_node = pod.role == workloads.RAY_NODE
        siblings = shared if pod.shape == workloads.INLINE else ()
        containers = detect.vllm_containers(pod.spec, pod.annotations, run.named, group, ray_node, siblings)
        if containers.unclear:
            result.refused += [f"{pod.where}: container {why}" for why in containers.unclear]
            continue
        run.matched.update(containers.runs_vllm)
        vllm = [c for c in pod.spec.get("containers") or [] if c.get("name") in containers.runs_vllm]
        if not vllm:
            continue
        try:
            for container in vllm:
                changed |= zero_image.ensure_container(container)
                args = fraction_args(container)  # from the GPU-memory request, where the default exceeds it
                if args is not None:
                    container["args"] = args
                    changed = True
                    result.guarded.append(f"{pod.where}: {container.get('name')}: {' '.join(args[-2:])}")
        except ValueError as error:
            result.refused.append(f"{pod.where}: {error}")
            continue
        init = pod.role != workloads.NO_INIT
        changed |= zero_image.ensure_pod(pod.spec, vllm[0], run.wheel_configmap, run.pins, run.python, init)
        note = (
            f" ({zero_image.init_python(pod.spec, vllm[0], run.python)})" if init
            else " (no init containers here: the InferenceServices that use it carry it)"
        )  # fmt: skip
        result.guarded.append(f"{pod.where}: {', '.join(containers.runs_vllm)}{note}")
        if not init:
            name = str((obj.get("metadata") or {}).get("name", ""))
            place = "workerSpec" if pod.where.endswith(".workerSpec") else "spec"
            run.runtimes.setdefault(name, {})[place] = vllm[0]
    return changed


def _guard_uses(obj: dict[str, Any], run: _Run) -> bool:
    """An InferenceService whose predictor names a ServingRuntime guarded in this stream: the init container
    (and the volumes, merged by name with the runtime's) in its predictor, and in its workerSpec where the
    runtime's worker pods run vLLM."""
    runtime = run.runtimes.get(workloads.runtime_name(obj) or "")
    if runtime is None:
        return False
    predictor = obj["spec"]["predictor"]
    changed = False
    for place, pod_spec in (("spec", predictor), ("workerSpec", predictor.get("workerSpec"))):
        if place in runtime and isinstance(pod_spec, dict):
            vllm = runtime[place]
            changed |= zero_image.ensure_pod(pod_spec, vllm, run.wheel_configmap, run.pins, run.python)
            where = "spec.predictor" + (".workerSpec" if place == "workerSpec" else "")
            run.result.guarded.append(
                f"{workloads.describe(obj)} {where}: the init container for runtime "
                f"{workloads.runtime_name(obj)}'s {vllm.get('name')} "
                f"({zero_image.init_python(pod_spec, vllm, run.python)})"
            )
    return changed


def _objects(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, dict):
        return []
    items = value.get("items")
    if str(value.get("kind", "")).endswith("List") and isinstance(items, list):
        return [item for item in items if isinstance(item, dict)]
    return [value]


def postrender(
    text: str, named: Sequence[str] = (), wheels: Mapping[str, bytes] | None = None, python: str | None = None
) -> Result:
    """The stream with the guard added; `wheels` ({file name: bytes}): a ConfigMap of them added to the
    stream (one per namespace of the guarded pods), mounted, and the init container pinned to their sha256;
    else the pods mount the `tmaguard-wheel` ConfigMap made by `tmaguard wheel-configmap`. `python`: the
    interpreter the init containers run (else the one each vLLM container's command names). Raises
    stream.StreamError, ValueError (wheels too large)."""
    result = Result()
    documents = stream.split(text)
    pins = tuple(sha256(data) for data in (wheels or {}).values())
    wheel_cm = configmap.wheel_configmap(zero_image.WHEEL_CONFIGMAP, wheels) if wheels else None
    wheel_name = wheel_cm["metadata"]["name"] if wheel_cm else zero_image.WHEEL_CONFIGMAP
    run = _Run(named, wheel_name, pins, python, result)
    namespaces: dict[str | None, None] = {}
    existing: set[tuple[str | None, str]] = set()
    changed = [False] * len(documents)
    for index, document in enumerate(documents):
        for obj in _objects(document.value):
            namespace = (obj.get("metadata") or {}).get("namespace")
            if obj.get("kind") == "ConfigMap":
                existing.add((namespace, (obj.get("metadata") or {}).get("name")))
            before = len(result.guarded)
            changed[index] |= _guard_object(obj, run)
            if len(result.guarded) > before:
                namespaces[namespace] = None
    for index, document in enumerate(documents):
        for obj in _objects(document.value):
            before = len(result.guarded)
            changed[index] |= _guard_uses(obj, run)
            if len(result.guarded) > before:
                namespaces[(obj.get("metadata") or {}).get("namespace")] = None
    unmatched = [name for name in named if name not in run.matched]
    if unmatched:
        result.refused.append(f"--container {', '.join(unmatched)}: no container so named in any pod here")
    if not result.guarded and not result.refused:
        result.refused.append(f"no container runs vLLM here (by its image or command): {HOW_TO_NAME}")
    if result.refused:
        return result
    out = [stream.rewrite(d, d.value) if c else d.text for d, c in zip(documents, changed, strict=True)]
    if wheel_cm is not None:
        for namespace in namespaces:
            if (namespace, wheel_name) not in existing:
                added = configmap.wheel_configmap(zero_image.WHEEL_CONFIGMAP, wheels or {}, namespace)
                if out and not out[-1].endswith("\n"):
                    out[-1] += "\n"
                out.append("---\n" + stream.dump(added))
    result.text = "".join(out)
    return result
