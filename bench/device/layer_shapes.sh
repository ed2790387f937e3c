#!/usr/bin/env bash
# Layer shapes on a Hopper machine, with vLLM 0.25.1 as bench/device/e2e/setup.sh installs it: torch matmul,
# a Triton kernel and Machete W4A16 (each checked against a reference, in its own process) under
#   gpa-v2      a layer exporting both cuGetProcAddress versions, the real driver only where the system keeps
#               it (not beside the layer), guard on
#   no-gpa      a layer with no cuGetProcAddress at all, beside the real driver: guard off, guard on
#   torch-first the upstream vCUDA shape, torch initialising CUDA before vLLM is imported, guard on
# plus vllm_tmaguard/csrc/proc_versions.h checked against the real driver. Results: $OUT/shapes.tgz.
# usage (repository root, after bench/device/e2e/setup.sh): bash bench/device/layer_shapes.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
state=${E2E_STATE:-/tmp/e2e}
out=/tmp/shapes-out
rm -rf "$out" /tmp/shapes && mkdir -p "$out"
py=$(command -v python3)
real=$($py -c "import os; from vllm_tmaguard.stages.loader import resolve_library as r
print(os.path.realpath(r('libcuda.so.1', {}).path))")

pod() {  # shape, beside (1: the real driver beside the layer)
  local dir=/tmp/shapes/$1 target=$real
  mkdir -p "$dir"
  if [ "$2" = 1 ]; then target=$dir/$(basename "$real"); ln -sf "$real" "$target"; fi
  $py bench/device/make_layer.py "$target" "$dir/libcuda.so.1" "$1" >> "$out/layers.txt"
}
pod gpa-v2 0
pod no-gpa 1
pod upstream 1

check() {  # name, layer shape, env...
  local name=$1 shape=$2; shift 2
  env PYTHONPATH="$state/site:$state/v25:$PWD/bench/device" LD_LIBRARY_PATH=/tmp/shapes/$shape \
    TMAGUARD_RECORD_DIR=/tmp/shapes/rec-$name CHECK_MODE=$name CHECK_STEPS=torch,triton,machete "$@" \
    timeout 400 "$py" bench/device/overlay_check.py > "$out/check-$name.log" 2>&1
  cp /tmp/shapes/rec-$name/last.json "$out/record-$name.json" 2>/dev/null || true
}
check gpa-v2 gpa-v2 &
check no-gpa-off no-gpa TMAGUARD_MODE=off &
check no-gpa no-gpa &
check torch-first upstream TORCH_FIRST=1 &
wait
for log in "$out"/check-*.log; do grep '^RESULT ' "$log" | tail -1 | cut -c8- >> "$out/checks.jsonl"; done
$py bench/device/proc_versions_check.py "$real" | tee "$out/proc_versions.log"
$py - "$out/checks.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    steps = {k: (v["ok"], v.get("error", "")[:120]) for k, v in r.items() if isinstance(v, dict)}
    print(r["mode"], steps)
PY
tar -czf "${OUT:-/tmp}/shapes.tgz" -C "$out" .
