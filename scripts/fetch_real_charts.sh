#!/usr/bin/env bash
# Places the real charts scripts/render_real_charts.py renders, at the commits docs/operator.md names, in the
# ignored .thirdparty/ (third-party code stays out of the repository): the vLLM production stack's helm/ and
# llm-d's modelservice chart. SOURCE: a clone of the repository (or its address: cloned without blobs into
# .thirdparty/src-*). The production stack's two monitoring dependencies (kube-prometheus-stack and
# prometheus-adapter, both off by default, fetched from OCI registries) are taken out of its Chart.yaml so
# that `helm template` renders it offline.
# usage: bash scripts/fetch_real_charts.sh [PRODUCTION_STACK_SOURCE] [LLM_D_MODELSERVICE_SOURCE]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/.thirdparty"
stack_commit=a6c01db0
llm_d_commit=3051935
mkdir -p "$out"

clone() {  # SOURCE NAME: a git directory holding SOURCE's history
  if [ -d "$1" ]; then
    echo "$1"
  else
    [ -d "$out/src-$2" ] || git clone -q --filter=blob:none --no-checkout "$1" "$out/src-$2"
    echo "$out/src-$2"
  fi
}

stack=$(clone "${1:-https://github.com/vllm-project/production-stack}" production-stack)
rm -rf "$out/production-stack-$stack_commit"
mkdir -p "$out/production-stack-$stack_commit"
git -C "$stack" archive "$stack_commit" helm | tar -x -C "$out/production-stack-$stack_commit"
"${PYTHON:-$root/.venv/bin/python}" - "$out/production-stack-$stack_commit/helm" <<'PY'
import sys
from pathlib import Path
import yaml
chart = Path(sys.argv[1])
meta = yaml.safe_load((chart / "Chart.yaml").read_text())
assert {d["name"] for d in meta.pop("dependencies", [])} == {"kube-prometheus-stack", "prometheus-adapter"}
(chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
(chart / "Chart.lock").unlink(missing_ok=True)
PY

llm_d=$(clone "${2:-https://github.com/llm-d-incubation/llm-d-modelservice}" llm-d-modelservice)
rm -rf "$out/llm-d-modelservice-$llm_d_commit"
mkdir -p "$out/llm-d-modelservice-$llm_d_commit"
git -C "$llm_d" archive "$llm_d_commit" charts/llm-d-modelservice | tar -x -C "$out/llm-d-modelservice-$llm_d_commit"
echo "placed $out/production-stack-$stack_commit/helm and" \
  "$out/llm-d-modelservice-$llm_d_commit/charts/llm-d-modelservice"
