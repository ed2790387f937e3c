"""A finding and its fix, as the report's JSON has them (docs/doctor.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SEVERITIES = ("error", "warning", "info", "ok")  # most severe first
PROBLEMS = frozenset({"error", "warning"})  # a finding of these makes the exit status 1


def finding(
    finding_id: str,
    severity: str,
    title: str,
    detail: str = "",
    subject: str | None = None,
    fix: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": finding_id,
        "severity": severity,
        "title": title,
        "detail": detail,
        "subject": subject,
        "fix": fix,
    }


def fix(
    text: str,
    env: Mapping[str, str] | None = None,
    vllm_args: list[str] | None = None,
    manifest: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "text": text,
        "env": dict(env or {}),
        "vllm_args": list(vllm_args or []),
        "manifest": manifest or [],
    }
