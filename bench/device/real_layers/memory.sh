#!/usr/bin/env bash
# One device call (issue 32, item 1): what each enforcing layer counts inside an 8 GiB limit, and which
# --gpu-memory-utilization starts `vllm serve` (vLLM 0.25.1, the e2e model) under it.
#   1. check.py memory in each pod: cudaMemGetInfo's used memory and PyTorch's share after the CUDA
#      context, a cuBLAS GEMM and a captured CUDA graph; NVML's view beside it.
#   2. `vllm serve` with the fractions named by SERVE (POD@FRACTION; default: 0.85 and 0.88 under the vCUDA
#      fork and HAMi-core 8c32de6 together, then vgpu-manager alone: in host compatibility mode it counts
#      every process on the GPU against its limit, so its servers run one at a time).
# Results: $OUT/memory.tgz. usage: bash bench/device/real_layers/memory.sh   (repository root; carry
# .dev/e2e/part1 .dev/thirdparty.tar.xz)
set -uo pipefail
export PYTHONUNBUFFERED=1
here=bench/device/real_layers
state=${STATE:-/tmp/rl}
out=$state/memory && rm -rf "$out" && mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
bash bench/device/e2e/setup.sh > "$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 1; }
LAYERS="vcuda-fork hami-8c32de6 vgpu-manager vcuda-master" bash $here/build.sh > "$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
export PYTHONPATH=/tmp/e2e/site:/tmp/e2e/v25:$(pwd)/bench/device
echo "== what each layer counts (check.py memory)"
for pod in ${MEMORY_PODS:-bare vcuda-fork hami-8c32de6 vgpu-manager vcuda-master}; do
  timeout 120 bash $here/pod.sh "$pod" -- python3 $here/check.py memory > "$out/memory-$pod.log" 2>&1
  echo "$pod: $(grep '^RESULT' "$out/memory-$pod.log" | cut -c8-900)"
done
echo "== vllm serve under an 8 GiB limit"
serve() {  # POD@FRACTION ...: together
  E2E_BUDGET_S=0 E2E_PROMPT_COUNT=2 E2E_READY_S=${READY_S:-240} E2E_FIRST_ALONE=0 \
    timeout 420 python3 bench/device/e2e/serve_pods.py "$@" 2>&1 | grep -E "^POD|Error|error" | cut -c1-400
  for pod in "$@"; do
    mkdir -p "$out/serve/$pod" && cp /tmp/e2e/results/"$pod"/{summary.json,server.log} "$out/serve/$pod/" 2>/dev/null
    grep -hE "OutOfMemoryError|total capacity|tmaguard pid" "$out/serve/$pod/server.log" 2>/dev/null | cut -c1-400 | head -6
  done
}
IFS=';' read -ra groups <<< "${SERVE:-fork@0.85 fork@0.88 hv12@0.85 hv12@0.88;vgm@0.85;vgm@0.88}"
for group in "${groups[@]}"; do serve $group; done
tar -czf "${OUT:-/tmp}/memory.tgz" -C "$state" memory
