"""The image recipe: deploy/Dockerfile is vLLM's image plus the manylinux wheel, and its build context
holds those wheels only."""

from __future__ import annotations

import fnmatch
import io
import re
import shutil
from pathlib import Path

from deploykit import DEPLOY


def test_dockerfile_is_the_vllm_image_plus_the_wheel(release) -> None:
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(fileobj=io.BytesIO((DEPLOY / "Dockerfile").read_bytes()))
    instructions = [(s["instruction"], s["value"]) for s in parser.structure if s["instruction"] != "COMMENT"]
    names = [name for name, _ in instructions]
    assert names == ["ARG", "FROM", "RUN"], instructions  # one stage: no compiler, no build in the image
    tag = instructions[0][1].split("=", 1)
    assert tag[0] == "VLLM_IMAGE_TAG" and re.fullmatch(r"v\d+\.\d+\.\d+", tag[1]), tag
    assert instructions[1][1] == "vllm/vllm-openai:${VLLM_IMAGE_TAG}"
    assert parser.parent_images == [f"vllm/vllm-openai:{tag[1]}"]
    run = instructions[2][1]
    assert run.startswith("--mount=type=bind,source=dist,target=/dist") and "pip install" in run
    wheel = re.search(r"/dist/(vllm_tmaguard-.*?\.whl)", run).group(1)
    for arch, built in release.wheels.items():
        assert fnmatch.fnmatchcase(built.name, wheel.replace("$(uname -m)", arch)), (wheel, built.name)


def _dockerignore_context(root: Path, patterns_file: Path) -> list[str]:
    """The files `docker build` sends from `root` under a .dockerignore (moby's rules: the last matching
    pattern wins, a pattern that matches a parent directory matches what is below it, `!` re-includes)."""
    rules = []
    for line in patterns_file.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = "".join(
            ".*" if part == "**" else "[^/]*" if part == "*" else "[^/]" if part == "?" else re.escape(part)
            for part in re.split(r"(\*\*|\*|\?)", pattern)
        )
        rules.append((negate, re.compile(regex.replace(".*/", "(.*/)?") + "$")))
    sent = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        parts = relative.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        excluded = False
        for negate, regex in rules:
            if any(regex.match(prefix) for prefix in prefixes):
                excluded = not negate
        if not excluded:
            sent.append(relative)
    return sent


def test_the_build_context_is_the_manylinux_wheels_only(release, tmp_path) -> None:
    """A work tree after scripts/build_wheels.sh and a local `pip wheel .`: only the manylinux wheels go."""
    root = tmp_path / "repo"
    for relative in ("setup.py", "README.md", ".venv/bin/python", "tests/conftest.py", "build/lib/x.so"):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text("")
    (root / "dist").mkdir()
    for built in (release.sdist, *release.wheels.values()):
        shutil.copy(built, root / "dist")
    (root / "dist" / "vllm_tmaguard-0.1.0-cp311-cp311-linux_x86_64.whl").write_text("")
    sent = _dockerignore_context(root, DEPLOY / "Dockerfile.dockerignore")
    assert sent == sorted(f"dist/{wheel.name}" for wheel in release.wheels.values())
