#!/usr/bin/env bash
# One device call (the no-rebuild install on a real layer): `vllm serve` under tkestack vCUDA master with
# vllm-tmaguard absent from the image's site-packages and placed by `tmaguard inject` in a directory on
# PYTHONPATH, as deploy/k8s/overlays/vcuda-stock-image does; then a completion, vLLM's /metrics
# (tmaguard_info) and each process's record. Then the guard's cost per process (bench/guard_cost.py --here)
# with the pip install restored. Results: $OUT/no-rebuild.tgz.
# usage: bash bench/device/real_layers/no_rebuild.sh   (repository root; carry .dev/e2e/part1 .thirdparty)
set -uo pipefail
here=bench/device/real_layers
root=$(pwd)
out=/tmp/no-rebuild && rm -rf "$out" && mkdir -p "$out/records" && chmod 0700 "$out/records"  # the guard refuses others
export PYTHONUNBUFFERED=1 QUOTA=$((24 << 30))
bash bench/device/e2e/setup.sh > "$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 1; }
bash $here/build.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
base_path=/tmp/e2e/site:/tmp/e2e/v25:$root/bench/device
# pod.sh asks the package where the real driver is: ask it now, before it leaves site-packages.
REAL_CUDA=$(python3 -c "import os; from vllm_tmaguard.stages.loader import resolve_library as r; print(os.path.realpath(r('libcuda.so.1', {}).path))")
REAL_NVML=$(python3 -c "import os; from vllm_tmaguard.stages.loader import resolve_library as r; print(os.path.realpath(r('libnvidia-ml.so.1', {}).path))")
export REAL_CUDA REAL_NVML

echo "== inject, then the pip install removed"
(cd /tmp && python3 -m vllm_tmaguard inject /tmp/e2e/inject) | tee "$out/inject.txt"
python3 -m pip uninstall -y -q vllm-tmaguard
(cd /tmp && python3 -c "import vllm_tmaguard" 2> /dev/null) && echo "STILL INSTALLED" || echo "not in site-packages"

echo "== vllm serve under vCUDA master, the injected guard"
PYTHONPATH=/tmp/e2e/inject:$base_path TMAGUARD_RECORD_DIR=$out/records setsid \
  bash $here/pod.sh vcuda-master HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0 DO_NOT_TRACK=1 VLLM_CACHE_ROOT=/tmp/e2e/cache CUDA_CACHE_PATH=/tmp/e2e/nv-cache \
  -- python3 -m vllm.entrypoints.cli.main serve /tmp/e2e/model --served-model-name tiny --port 8300 --seed 0 \
  > "$out/server.log" 2>&1 &
server=$!
start=$(date +%s)
until curl -sf localhost:8300/health > /dev/null; do
  if ! kill -0 $server 2> /dev/null || [ $(( $(date +%s) - start )) -gt ${READY_S:-300} ]; then
    echo "not ready"; tail -30 "$out/server.log"; break
  fi
  sleep 2
done
echo "ready after $(( $(date +%s) - start )) s"
curl -s localhost:8300/v1/completions -H 'Content-Type: application/json' \
  -d '{"model": "tiny", "prompt": "hello", "max_tokens": 16, "temperature": 0}' > "$out/completion.json"
echo "completion: $(head -c 300 "$out/completion.json")"
curl -s localhost:8300/metrics > "$out/metrics.txt"
echo "metrics: $(grep -c '^vllm:' "$out/metrics.txt") vllm: lines; $(grep '^tmaguard_info' "$out/metrics.txt")"
kill -TERM -- -$server 2> /dev/null || kill $server; sleep 5; pkill -f "port 8300" 2> /dev/null
grep '^(tmaguard pid=' "$out/server.log" | cut -c1-400

echo "== the guard's cost per process (pip install restored)"
python3 -m pip install -q --no-index --no-deps --no-build-isolation --force-reinstall . > /dev/null 2>&1
for pod in bare vcuda-master; do
  PYTHONPATH=$base_path timeout 120 bash $here/pod.sh "$pod" -- python3 bench/guard_cost.py --here --runs 20 \
    > "$out/cost-$pod.txt" 2>&1
  echo "$pod: $(tail -1 "$out/cost-$pod.txt")"
done
tar -czf "${OUT:-/tmp}/no-rebuild.tgz" -C /tmp no-rebuild
