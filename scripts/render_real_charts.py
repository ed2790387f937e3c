"""Renders the real third-party charts at named commits, with Helm's own library (helm-python-sdk, offline, no
cluster), and records what came out in docs/operator.md (the section between the real-charts markers).
A developer's script, not CI's: the charts are third-party code and stay out of the repository, in the
ignored .thirdparty/ (CI renders the charts of the same shapes in tests/deploy/charts).

    # the production stack's chart at a named commit, from a clone (or the fetched snapshot) of
    # vllm-project/production-stack:
    git -C PRODUCTION_STACK archive a6c01db0 helm | tar -x -C .thirdparty/production-stack-a6c01db0
    # optionally vLLM's chart, from a clone of vllm-project/vllm (or its files as a code index stores them:
    # docs/operator.md names the commits they came from):
    git -C VLLM archive COMMIT examples/online_serving/chart-helm | tar -x -C .thirdparty/vllm-COMMIT
    .venv/bin/python scripts/render_real_charts.py --stack .thirdparty/production-stack-a6c01db0/helm \\
        --stack-commit a6c01db0 [--vllm-chart .thirdparty/vllm-COMMIT/examples/online_serving/chart-helm \\
        --vllm-commit COMMIT] [--write]

Each chart is rendered (1) with deploy/helm/production-stack-values.yaml where it is the production stack,
(2) with a plain model and `tmaguard manifests` as the post-renderer, twice (the second run must change
nothing); every object is validated with deploy/render.py's schema checks."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "deploy"))
import render  # noqa: E402  (deploy/render.py: the schema checks of deploy/)

OPERATOR_DOC = REPO / "docs" / "operator.md"
BEGIN = "<!-- real-charts: written by `python scripts/render_real_charts.py --write`; do not edit -->"
END = "<!-- end of real-charts -->"
TMAGUARD = str(Path(sys.executable).parent / "tmaguard")
MODEL = {
    "name": "qwen",
    "repository": "vllm/vllm-openai",
    "tag": "v0.32.0",
    "modelURL": "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
    "requestCPU": 4,
    "requestMemory": "32Gi",
    "requestGPU": 1,
}


def helm_template(chart: Path, values: dict[str, Any]) -> str:
    """What `helm template` hands a post-renderer: each document after `---` and its `# Source:` line."""
    with helm.Chart.load(chart) as loaded:
        rendered = loaded.render(values, name="vllm", namespace="default")
    out = []
    for path, text in sorted(rendered.items()):
        for document in re.split(r"(?:^|\s*\n)---\s*", text):
            if document.strip() and path.endswith((".yaml", ".yml")):
                out.append(f"---\n# Source: {path}\n{document.strip()}\n")
    return "".join(out)


def objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def schema_problems(text: str) -> list[str]:
    return [str(p) for obj in objects(text) for p in render.schema_problems(obj)]


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


def chart_name(chart: Path) -> str:
    with helm.Chart.load(chart) as loaded:
        return f"chart `{loaded.name}` {loaded.version}"


def summary(name: str, commit: str, text: str, guarded: str | None, before: str | None) -> list[str]:
    deployments = [o for o in objects(text) if o.get("kind") == "Deployment"]
    lines = [f"- **{name}** at `{commit}`: {len(objects(text))} objects, Deployments "]
    lines[-1] += ", ".join(f"`{d['metadata']['name']}`" for d in deployments)
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        inits = [c["name"] for c in pod.get("initContainers", [])]
        for container in pod["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env") or []}
            if "PYTHONPATH" in env:
                lines.append(
                    f"  - `{deployment['metadata']['name']}`: init containers {inits}; `{container['name']}`"
                    f" with PYTHONPATH={env['PYTHONPATH']}, image `{container['image']}`"
                )
    if guarded is not None and before is not None:
        kept, total = unchanged(before, text)
        lines.append(f"  - post-renderer: {guarded.strip()}; {kept} of {total} documents byte for byte")
        lines.append("  - a second run changed nothing")
    problems = schema_problems(text)
    versions = " and ".join(render.KUBERNETES_VERSIONS)
    lines.append(f"  - schema checks (Kubernetes {versions}, strict): {len(problems)} problems")
    lines += [f"    - {p}" for p in problems]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", type=Path, required=True, help="production-stack's helm/ directory")
    parser.add_argument("--stack-commit", required=True)
    parser.add_argument("--vllm-chart", type=Path, help="vLLM's examples/online_serving/chart-helm")
    parser.add_argument("--vllm-commit")
    parser.add_argument("--write", action="store_true", help="write the result into docs/operator.md")
    args = parser.parse_args(argv)

    values = yaml.safe_load((REPO / "deploy/helm/production-stack-values.yaml").read_text())
    lines = [
        f"Rendered by Helm's library (helm-python-sdk {helm.__version__}, Helm {helm.helm_sdk_version()}):"
    ]
    stack = f"vllm-project/production-stack helm/ ({chart_name(args.stack)})"
    lines += summary(f"{stack}, deploy/helm/production-stack-values.yaml", args.stack_commit,
                     helm_template(args.stack, values), None, None)  # fmt: skip
    plain = {"servingEngineSpec": {"runtimeClassName": "", "modelSpec": [MODEL]}}
    before = helm_template(args.stack, plain)
    after, said = post_render(before)
    lines += summary(
        "production-stack, a plain model, `tmaguard manifests`", args.stack_commit, after, said, before
    )
    if args.vllm_chart:
        before = helm_template(args.vllm_chart, {})
        after, said = post_render(before)
        lines += summary(
            "vLLM's chart-helm, `tmaguard manifests`", args.vllm_commit or "?", after, said, before
        )
    else:
        lines.append("- vLLM's chart-helm: not rendered in this run (no --vllm-chart)")
    section = "\n".join(lines)
    print(section)
    if args.write:
        text = OPERATOR_DOC.read_text()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        OPERATOR_DOC.write_text(text[:start] + "\n" + section + "\n" + text[end:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
