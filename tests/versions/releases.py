"""The vLLM releases the version matrix proves the guard with, and what each one's environment holds.

Each release gets its own virtualenv with exactly the torch its wheel pins (`torch===X`: the index config
here also offers a local +cpu build), vLLM installed `--no-deps`, and the packages its import path needs:
found by running the release's real import path and selectors on an emulated pod until nothing was missing,
pinned to the versions that ran. The default release (scripts/setup_env.sh, what CI tests) uses .venv."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / ".versions"  # ignored: venvs, uv and its cache (hard links between the venvs), results
VENVS = WORK / "venvs"
RESULTS = WORK / "results"
DEFAULT_RELEASE = "0.32.0"  # scripts/setup_env.sh's vLLM


@dataclass(frozen=True)
class Release:
    vllm: str
    torch: str  # the wheel's `Requires-Dist: torch==X`
    deps: tuple[str, ...]  # import-time packages beyond torch (pinned)

    @property
    def venv(self) -> Path:
        return ROOT / ".venv" if self.vllm == DEFAULT_RELEASE else VENVS / self.vllm

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def stamp(self) -> str:
        """Changes whenever what the venv must hold changes."""
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


# What vLLM's import path needs in every release from 0.8.5 on (pinned where a release's wheel does not).
_SERVING = (
    "cachetools==8.0.1",
    "psutil==7.2.2",
    "numpy==2.4.6",
    "requests==2.34.2",
    "py-cpuinfo==9.0.0",
    "aiohttp==3.14.5",
    "openai==3.54.0",
    "pydantic==2.14.3",
    "prometheus_client==0.26.0",
    "pillow==13.0.0",
    "partial-json-parser==0.2.1.1.post7",
    "pyzmq==27.3.0",
    "msgspec==0.22.0",
    "einops==0.8.2",
    "cloudpickle==3.1.2",
)
_SINCE_0_10 = (*_SERVING, "regex==2026.11.15", "pybase64==1.5.1", "cbor2==6.3.0")
_HARMONY, _BLAKE3 = "openai-harmony==0.0.8", "blake3==1.0.11"
_FASTAPI, _FASTAPI_0_25 = "fastapi[standard]==0.165.0", "fastapi[standard]==0.136.3"
RELEASES = (
    # 0.6.6 imports its whole engine at `import vllm`, and finds the GPU with pynvml (nvidia-ml-py).
    Release(
        "0.6.6.post1",
        "2.5.1",
        (
            "numpy==1.26.4",
            "transformers==4.47.1",
            "nvidia-ml-py==13.615.71",
            "pydantic==2.14.3",
            "msgspec==0.22.0",
            "mistral_common==1.13.1",
            "psutil==7.2.2",
            "opencv-python-headless==4.10.0.84",
            "cloudpickle==3.1.2",
            "py-cpuinfo==9.0.0",
            "aiohttp==3.14.5",
            "openai==3.54.0",
        ),
    ),
    Release(
        "0.8.5",
        "2.6.0",
        (*_SERVING, _FASTAPI, _BLAKE3, "llguidance==0.7.30", "xgrammar==0.1.18", "transformers==4.51.3"),
    ),
    Release(
        "0.10.2",
        "2.8.0",
        (
            *_SINCE_0_10,
            _FASTAPI,
            _HARMONY,
            _BLAKE3,
            "setproctitle==1.3.8",
            "llguidance==0.7.30",
            "xgrammar==0.1.23",
            "transformers==4.56.1",
        ),
    ),
    Release(
        "0.11.2",
        "2.9.0",
        (
            *_SINCE_0_10,
            _FASTAPI,
            _HARMONY,
            _BLAKE3,
            "llguidance==1.3.0",
            "xgrammar==0.1.25",
            "transformers==4.57.1",
        ),
    ),
    Release(
        "0.15.1",
        "2.9.1",
        (
            *_SINCE_0_10,
            _FASTAPI,
            _HARMONY,
            "llguidance==1.3.0",
            "xgrammar==0.1.29",
            "transformers==4.57.1",
            "gguf==0.19.0",
            "setuptools==80.10.2",
        ),
    ),
    Release(
        "0.20.2",
        "2.11.0",
        (
            *_SINCE_0_10,
            _FASTAPI,
            _HARMONY,
            "llguidance==1.3.0",
            "xgrammar==0.2.8",
            "transformers==4.57.1",
            "gguf==0.19.0",
        ),
    ),
    # Humming: the wheel requires it, and at compute capability 9.0 it changes what the selectors pick.
    Release(
        "0.25.1",
        "2.11.0",
        (
            *_SINCE_0_10,
            _FASTAPI_0_25,
            _HARMONY,
            "llguidance==1.7.6",
            "xgrammar==0.2.8",
            "transformers==5.23.0",
            "humming-kernels==0.1.10",
        ),
    ),
    Release(DEFAULT_RELEASE, "2.13.0", ()),  # .venv, built by scripts/setup_env.sh
    Release(
        "0.33.0",
        "2.14.0",
        (
            *_SINCE_0_10,
            _FASTAPI_0_25,
            _HARMONY,
            "llguidance==1.7.6",
            "xgrammar==0.2.8",
            "transformers==5.20.2",
            "humming-kernels==0.1.19",
        ),
    ),
)
BY_VERSION = {release.vllm: release for release in RELEASES}
