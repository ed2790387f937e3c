"""Renders the real third-party charts at named commits with the real Helm (scripts/install_helm.sh: Helm
4.1.4, offline, no cluster) and records what came out in docs/operator.md (the section between the real-charts
markers). A developer's script, not CI's: the charts are third-party code and stay out of the repository, in
the ignored .thirdparty/ (scripts/fetch_real_charts.sh places them; CI renders the charts of the same shapes
in tests/deploy/charts).

    bash scripts/fetch_real_charts.sh          # the production stack, llm-d's modelservice, at their commits
    .venv/bin/python scripts/render_real_charts.py --stack .thirdparty/production-stack-a6c01db0/helm \\
        --stack-commit a6c01db0 [--vllm-chart DIR --vllm-commit COMMIT] \\
        [--llm-d-chart .thirdparty/llm-d-modelservice-3051935/charts/llm-d-modelservice \\
         --llm-d-commit 3051935] [--write]

Each chart is rendered (1) with this repository's values file for it (deploy/helm/), (2) with a plain model
and `tmaguard manifests` as the post-renderer, twice (the second run must change nothing), once more as Helm 4
runs it (the plugin deploy/helm/tmaguard-postrenderer: the same objects); the production stack in both its
modes (a Deployment, and a KubeRay RayCluster with raySpec.enabled). Every built-in object is validated with
deploy/render.py's schema checks; the pod specs of the other kinds (RayCluster, LeaderWorkerSet) as Pods'."""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "deploy"))
import render  # noqa: E402  (deploy/render.py: the schema checks of deploy/)

from vllm_tmaguard.install.manifests import workloads  # noqa: E402

OPERATOR_DOC = REPO / "docs" / "operator.md"
BEGIN = "<!-- real-charts: written by `python scripts/render_real_charts.py --write`; do not edit -->"
END = "<!-- end of real-charts -->"
TMAGUARD = str(Path(sys.executable).parent / "tmaguard")
HELM = REPO / ".tools" / "helm" / "bin" / "helm"
MODEL = {
    "name": "qwen",
    "repository": "vllm/vllm-openai",
    "tag": "v0.32.0",
    "modelURL": "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
    "requestCPU": 4,
    "requestMemory": "32Gi",
    "requestGPU": 1,
}
RAY = {"enabled": True, "headNode": {"requestCPU": 4, "requestMemory": "32Gi", "requestGPU": 1}}
LLM_D = {
    "multinode": True,
    "modelArtifacts": {
        "name": "Qwen/Qwen2.5-7B-Instruct",
        "uri": "hf://Qwen/Qwen2.5-7B-Instruct",
        "size": "20Gi",
    },
    "routing": {"proxy": {"image": "ghcr.io/llm-d/llm-d-routing-sidecar:v0.4.0", "targetPort": 8200}},
    "decode": {
        "create": True,
        "parallelism": {"tensor": 1, "data": 16, "dataLocal": 8},
        "containers": [
            {
                "name": "vllm",
                "image": "ghcr.io/llm-d/llm-d-cuda:v0.4.0",
                "modelCommand": "vllmServe",
                "resources": {"limits": {"nvidia.com/gpu": "8"}},
            }
        ],
    },
    "prefill": {"create": False},
}


class Helm:
    """The real Helm binary, with a home of its own (the post-renderer plugin installed there)."""

    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        self.env |= {f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("DATA", "CONFIG", "CACHE")}
        plugin = REPO / "deploy" / "helm" / "tmaguard-postrenderer"
        self._run(["plugin", "install", str(plugin)])

    def _run(self, args: list[str]) -> str:
        done = subprocess.run(
            [str(self.binary), *args], env=self.env, capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise SystemExit(f"helm {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout

    def version(self) -> str:
        return self._run(["version", "--short"]).strip()

    def template(self, chart: Path, values: dict[str, Any], *flags: str) -> str:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
            yaml.safe_dump(values, file)
            file.flush()
            return self._run(
                ["template", "vllm", str(chart), "--namespace", "default", "-f", file.name, *flags]
            )

    def chart_name(self, chart: Path) -> str:
        meta = yaml.safe_load(self._run(["show", "chart", str(chart)]))
        return f"chart `{meta['name']}` {meta['version']}"


def objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def schema_problems(text: str) -> list[str]:
    """Built-in objects against Kubernetes' schemas; the pod specs of the other kinds as a Pod's (1.37: the
    charts' native sidecar init containers are newer than 1.25)."""
    problems = []
    for obj in objects(text):
        custom = obj.get("kind") in workloads.KINDS and workloads.KINDS[obj["kind"]][0] != ""
        if not custom:
            problems += [str(p) for p in render.schema_problems(obj)]
            continue
        for pod in workloads.pod_specs(obj) or []:
            pod_obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": pod.spec}
            problems += [f"{pod.where}: {p}" for p in render.schema_problems(pod_obj, ("1.37",))]
    return problems


def post_render(text: str) -> tuple[str, str]:
    """Bytes in and out, as Helm pipes them: text mode would turn a chart's CRLF line ends into LF and make
    every document look changed."""
    first = subprocess.run([TMAGUARD, "manifests"], input=text.encode(), capture_output=True, check=False)
    if first.returncode != 0:
        raise SystemExit(f"tmaguard manifests failed ({first.returncode}):\n{first.stderr.decode()}")
    second = subprocess.run([TMAGUARD, "manifests"], input=first.stdout, capture_output=True)
    if second.stdout != first.stdout:
        raise SystemExit("tmaguard manifests: a second run changed the output")
    return first.stdout.decode(), first.stderr.decode()


def unchanged(before: str, after: str) -> tuple[int, int]:
    """(documents written back byte for byte, documents in all)."""
    split = re.compile(r"(?m)^(?=---$)")
    old, new = split.split(before)[1:], split.split(after)[1:]  # [0]: what comes before the first ---
    return sum(a == b for a, b in zip(old, new, strict=False)), len(old)


def _sorted(text: str) -> list[dict[str, Any]]:
    return sorted(objects(text), key=lambda o: (o["kind"], o["metadata"]["name"]))


def summary(
    name: str, commit: str, text: str, guarded: str | None = None, before: str | None = None
) -> list[str]:
    lines = [f"- **{name}** at `{commit}`: {len(objects(text))} objects"]
    for obj in objects(text):
        for pod in workloads.pod_specs(obj) or []:
            inits = pod.spec.get("initContainers") or []
            for container in pod.spec.get("containers") or []:
                env = {e["name"]: e.get("value") for e in container.get("env") or []}
                if "PYTHONPATH" in env:
                    ours = next((c for c in inits if c["name"] == "tmaguard-inject"), {})
                    lines.append(
                        f"  - {pod.where}: init containers {[c['name'] for c in inits]} (tmaguard-inject "
                        f"runs `{(ours.get('command') or ['?'])[0]}`); `{container['name']}` with "
                        f"PYTHONPATH={env['PYTHONPATH']}, image `{container['image']}`"
                    )
    if guarded is not None and before is not None:
        kept, total = unchanged(before, text)
        said = "; ".join(line.removeprefix("tmaguard manifests: ") for line in guarded.strip().splitlines())
        lines.append(f"  - post-renderer: {said}; {kept} of {total} documents byte for byte")
        lines.append("  - a second run changed nothing; Helm 4's plugin gave the same objects")
    problems = schema_problems(text)
    versions = " and ".join(render.KUBERNETES_VERSIONS)
    lines.append(f"  - schema checks (Kubernetes {versions}, strict; other kinds' pod specs as Pods): "
                 f"{len(problems)} problems")  # fmt: skip
    lines += [f"    - {p}" for p in problems]
    return lines


def through_post_renderer(
    helm: Helm, chart: Path, values: dict[str, Any], name: str, commit: str
) -> list[str]:
    before = helm.template(chart, values)
    after, said = post_render(before)
    by_plugin = helm.template(chart, values, "--post-renderer", "tmaguard")
    if _sorted(by_plugin) != _sorted(after):
        raise SystemExit(f"{name}: Helm 4's plugin gave other objects than `tmaguard manifests`")
    return summary(name, commit, after, said, before)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--helm", type=Path, default=HELM, help="the Helm 4 binary (scripts/install_helm.sh)")
    parser.add_argument("--stack", type=Path, required=True, help="production-stack's helm/ directory")
    parser.add_argument("--stack-commit", required=True)
    parser.add_argument("--vllm-chart", type=Path, help="vLLM's examples/online_serving/chart-helm")
    parser.add_argument("--vllm-commit")
    parser.add_argument("--llm-d-chart", type=Path, help="llm-d-modelservice's charts/llm-d-modelservice")
    parser.add_argument("--llm-d-commit")
    parser.add_argument("--write", action="store_true", help="write the result into docs/operator.md")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as home:
        helm = Helm(args.helm, Path(home))
        lines = [f"Rendered by Helm {helm.version()} (`helm template`; the post-renderer as its plugin):"]
        values = yaml.safe_load((REPO / "deploy/helm/production-stack-values.yaml").read_text())
        stack = f"vllm-project/production-stack helm/ ({helm.chart_name(args.stack)})"
        lines += summary(f"{stack}, deploy/helm/production-stack-values.yaml", args.stack_commit,
                         helm.template(args.stack, values))  # fmt: skip
        ray_values = copy.deepcopy(values)
        ray_values["servingEngineSpec"]["modelSpec"][0]["raySpec"]["enabled"] = True
        lines += summary(f"{stack} in Ray mode, deploy/helm/production-stack-values.yaml", args.stack_commit,
                         helm.template(args.stack, ray_values))  # fmt: skip
        plain = {"servingEngineSpec": {"runtimeClassName": "", "modelSpec": [MODEL]}}
        lines += through_post_renderer(helm, args.stack, plain, "production-stack, a plain model, "
                                       "`tmaguard manifests`", args.stack_commit)  # fmt: skip
        ray = {"servingEngineSpec": {"runtimeClassName": "", "modelSpec": [MODEL | {"raySpec": RAY}]}}
        lines += through_post_renderer(helm, args.stack, ray, "production-stack in Ray mode, "
                                       "`tmaguard manifests`", args.stack_commit)  # fmt: skip
        if args.vllm_chart:
            lines += through_post_renderer(helm, args.vllm_chart, {}, "vLLM's chart-helm, "
                                           "`tmaguard manifests`", args.vllm_commit or "?")  # fmt: skip
        else:
            lines.append("- vLLM's chart-helm: not rendered in this run (no --vllm-chart)")
        if args.llm_d_chart:
            llm_d = f"llm-d-incubation/llm-d-modelservice ({helm.chart_name(args.llm_d_chart)})"
            ours = yaml.safe_load((REPO / "deploy/helm/llm-d-modelservice-values.yaml").read_text())
            lines += summary(f"{llm_d}, deploy/helm/llm-d-modelservice-values.yaml", args.llm_d_commit or "?",
                             helm.template(args.llm_d_chart, ours))  # fmt: skip
            lines += through_post_renderer(helm, args.llm_d_chart, LLM_D, "llm-d modelservice, multinode, "
                                           "`tmaguard manifests`", args.llm_d_commit or "?")  # fmt: skip
        else:
            lines.append("- llm-d's modelservice: not rendered in this run (no --llm-d-chart)")
    section = "\n".join(lines)
    print(section)
    if args.write:
        text = OPERATOR_DOC.read_text()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        OPERATOR_DOC.write_text(text[:start] + "\n" + section + "\n" + text[end:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
