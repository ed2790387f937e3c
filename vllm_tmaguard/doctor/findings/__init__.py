"""The findings: pure functions of the gathered report (gather.py), one module per subject, and what they
conclude: the status, the exit status and the fixes of every problem merged."""

from __future__ import annotations

import json
from typing import Any

from . import active, architectures, gaps, guard, layers, memory, platform
from .base import PROBLEMS, SEVERITIES


def conclude(report: dict[str, Any]) -> dict[str, Any]:
    """The report with its findings, status, exit status and merged fix."""
    findings = diagnose(report)
    problems = any(f["severity"] in PROBLEMS for f in findings)
    return {
        **report,
        "status": "problems" if problems else "healthy",
        "exit_code": 1 if problems else 0,
        "findings": findings,
        "fix": merged_fix(findings),
    }


def diagnose(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every finding, most severe first (stable within a severity)."""
    findings = (
        platform.gpu_findings(report)
        + platform.libcuda_findings(report)
        + platform.vllm_findings(report)
        + platform.layer_findings(report)
        + layers.layer_detail_findings(report)
        + gaps.gap_findings(report)
        + guard.decision_findings(report)
        + memory.memory_findings(report)
        + architectures.arch_findings(report)
        + guard.guard_findings(report)
        + active.active_findings(report)
    )
    return sorted(findings, key=lambda f: SEVERITIES.index(f["severity"]))


def merged_fix(findings: list[dict[str, Any]]) -> dict[str, Any]:
    """The fixes of every problem, merged: steps to take, variables to set, vLLM flags, manifest lines."""
    steps, env, args, manifest = [], {}, [], []
    for finding in findings:
        fix = finding["fix"]
        if finding["severity"] not in PROBLEMS or not fix:
            continue
        if fix["text"] not in steps:
            steps.append(fix["text"])
        env.update(fix["env"])
        args += [a for a in fix["vllm_args"] if a not in args]
        manifest += [line for line in fix["manifest"] if line not in manifest]
    toggles = {k: v for k, v in env.items() if k.startswith("TMAGUARD_")}
    others = {k: v for k, v in env.items() if k not in toggles}
    if toggles:  # the manifests set the toggles in one ConfigMap (deploy/k8s/base/tmaguard-toggles.yaml)
        manifest += ["# ConfigMap tmaguard-toggles:", "data:"]
        manifest += [f"  {k}: {json.dumps(v)}" for k, v in toggles.items()]
    if others:
        manifest += ["# the vLLM container:", "env:"]
        manifest += [f"  - name: {k}\n    value: {json.dumps(v)}" for k, v in others.items()]
    if args:
        manifest += [f"args: {json.dumps(args)}  # added to vLLM's arguments"]
    return {"steps": steps, "env": env, "vllm_args": args, "manifest": "\n".join(manifest)}
