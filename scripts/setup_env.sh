#!/usr/bin/env bash
# Builds the test environment: a virtualenv with a CUDA build of torch, vLLM (no deps, plus what its
# import path needs), this package (which compiles its C shim) and the test tools. Idempotent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${TMAGUARD_VENV:-$root/.venv}
python=${PYTHON:-python3}
vllm_version=${TMAGUARD_TEST_VLLM:-0.32.0}
torch_version=${TMAGUARD_TEST_TORCH:-2.13.0}
# The stamp changes whenever this script does, so a changed dependency list is installed on the next run.
stamp="$venv/.tmaguard-env-$(sha1sum "$0" | cut -c1-12)"

if [ ! -f "$stamp" ]; then
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  # "===" asks for exactly this version: the index config also offers a local +cpu build, which lacks
  # libtorch_cuda.so (DESIGN.md §5).
  "${pip[@]}" "torch===$torch_version"
  "${pip[@]}" --no-deps "vllm==$vllm_version"
  # What vLLM's import path needs (DESIGN.md §5); installing vLLM with its deps pins versions the
  # index cannot always satisfy. Where vLLM 0.32.0 pins a version, the same pin.
  "${pip[@]}" numpy packaging regex psutil pyzmq urllib3 "transformers>=5.16.1,<5.20.0" requests cbor2 \
    aiohttp openai-harmony openai pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo \
    prometheus_client "xgrammar==0.2.8" fastapi partial_json_parser "llguidance>=1.7.0,<1.8.0" einops
  # vLLM 0.32.0 requires humming-kernels 0.1.17; its kernel outranks Marlin at compute capability 9.0, so
  # the selectors only behave as in a normal install with it present.
  "${pip[@]}" "humming-kernels==0.1.17"
  "${pip[@]}" pytest nvidia-ml-py typer rich ruff hypothesis kubernetes-validate jsonpatch yamllint dockerfile-parse matplotlib
  touch "$stamp"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps --force-reinstall "$root"
