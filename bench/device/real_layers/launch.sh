#!/usr/bin/env bash
# One device call (issue 32, items 1-2): what the guard changes about how vLLM is started, under the real
# layers with an 8 GiB limit, the guard installed and nothing else set (vLLM 0.25.1, the e2e model):
#   1. the guard's line in a `vllm serve ... --gpu-memory-utilization 0.92` process (a user's value: kept,
#      warned about with the value that fits) under the vCUDA fork, HAMi-core 8c32de6 and vgpu-manager;
#   2. `vllm serve` with no memory flag under each of them (the guard adds the value that fits), every
#      process probed (E2E_PROBE: what cudaMemGetInfo shows it, 10 GiB past the limit refused or not);
#   3. VLLM_ENABLE_CUDA_COMPATIBILITY=1 with a compat directory of the driver's own files (/tmp/compat)
#      under vCUDA master and the fork: the EngineCore probed in the same way.
# vgpu-manager counts every process on the GPU against a pod's limit (host compatibility mode): its server
# runs alone. Results: $OUT/launch.tgz. usage: bash bench/device/real_layers/launch.sh   (repository root;
# carry .dev/e2e/part1 .dev/thirdparty.tar.xz)
set -uo pipefail
export PYTHONUNBUFFERED=1
here=bench/device/real_layers
state=${STATE:-/tmp/rl}
out=$state/launch && rm -rf "$out" && mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
bash bench/device/e2e/setup.sh > "$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 1; }
LAYERS="vcuda-fork hami-8c32de6 vgpu-manager vcuda-master" bash $here/build.sh > "$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
export PYTHONPATH=/tmp/e2e/site:/tmp/e2e/v25:$(pwd)/bench/device
rm -rf /tmp/compat && mkdir -p /tmp/compat
real=$(readlink -f /usr/local/nvidia/lib64/libcuda.so.1)
cp "$real" /tmp/compat/libcuda.so.1 && cp "$real" "/tmp/compat/$(basename "$real")"
echo "== a user's --gpu-memory-utilization 0.92: the guard's line"
for pod in vcuda-fork hami-8c32de6 vgpu-manager; do
  TMAGUARD_RECORD_DIR=$out/user-$pod timeout 120 bash $here/pod.sh "$pod" TMAGUARD_RECORD_DIR=$out/user-$pod -- \
    python3 -c "import sys; sys.argv = ['/usr/local/bin/vllm', 'serve', '/tmp/e2e/model', '--gpu-memory-utilization', '0.92']; import vllm" \
    > "$out/user-$pod.log" 2>&1
  echo "$pod: $(grep -h 'tmaguard pid' "$out/user-$pod.log" | cut -c1-420)"
done
serve() {  # POD ...: together
  E2E_PROBE=1 E2E_BUDGET_S=0 E2E_PROMPT_COUNT=2 E2E_READY_S=${READY_S:-240} E2E_FIRST_ALONE=0 \
    timeout 400 python3 bench/device/e2e/serve_pods.py "$@" 2>&1 | grep -E "^(POD|PROBE)" | cut -c1-300
  for pod in "$@"; do
    mkdir -p "$out/serve/$pod" && cp /tmp/e2e/results/"$pod"/{summary.json,server.log} "$out/serve/$pod/" 2>/dev/null
    grep -hE "OutOfMemoryError|tmaguard pid|Available KV" "$out/serve/$pod/server.log" 2>/dev/null | cut -c1-330 | head -8
  done
}
echo "== vllm serve with no memory flag; the compat switch under vCUDA master"
serve fork hv12 vm-compat
echo "== vgpu-manager alone"
serve vgm
echo "== the compat switch under the fork"
serve fork-compat
tar -czf "${OUT:-/tmp}/launch.tgz" -C "$state" launch
