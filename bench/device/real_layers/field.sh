#!/usr/bin/env bash
# One device call: the other sharing layers operators run (issue 26), each built from its source
# (build.sh) in its device plugin's layout (pod.sh), with this package installed and nothing else set: every
# check of check.py in its own process, torch alone and after `import vllm`; the guard off where a layer
# fails without it; nvshare without its scheduler's socket; lupine's fp16 cuBLAS traced; the doctor,
# passive and active, in each pod. Results: $OUT/field-checks.tgz (checks.jsonl: one RESULT per process;
# logs/; records/; doctor/).
# usage: [PODS="lupine ..."] bash bench/device/real_layers/field.sh   (repository root; carry .dev/e2e/part1
#        and .dev/thirdparty.tar.xz, made by bench/device/e2e/prepare.sh and real_layers/sources.sh)
set -uo pipefail
export PYTHONUNBUFFERED=1
here=bench/device/real_layers
state=${STATE:-/tmp/rl}
out=$state/field && rm -rf "$out" "$state/records" && mkdir -p "$out/logs" "$out/doctor"
pods=${PODS:-vcuda-fork vgpu-manager hami-8c32de6 hami-93cf05d nvshare lupine}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
E2E_MODEL=0 bash bench/device/e2e/setup.sh > "$out/logs/setup.log" 2>&1 || { tail -30 "$out/logs/setup.log"; exit 1; }
LAYERS="${pods//+nosocket/} $([ "${COST:-1}" = 1 ] && echo vcuda-master)" bash $here/build.sh \
  > "$out/logs/build.log" 2>&1 || { tail -40 "$out/logs/build.log"; exit 1; }
grep -h "exports cu" "$out/logs/build.log"
echo "== the markers layers.py reads, in the files as built"
for lib in "$state"/layers/*/libcuda-control.so "$state"/layers/*/libvgpu.so "$state"/layers/lupine/libcuda.so.1; do
  [ -f "$lib" ] || continue
  echo "$lib: SONAME $(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p');" \
    "$(nm -D --defined-only "$lib" | awk '{print $NF}' | grep -xE 'delta|cuda_hooks_entry|g_vcuda_config|search_on_pids_table|ensure_post_init|cuLaunchKernelEx|cuMemRelease|cuGetProcAddress_v2|cuTensorMapEncodeTiled|lupine_checkpoint_drain_cuda_calls|dlsym' | tr '\n' ' ')"
done
export PYTHONPATH=/tmp/e2e/site:/tmp/e2e/v25:$(pwd)/bench/device

check() {  # pod step [--vllm] [NAME=VALUE ...]; a step gets STEP_TIMEOUT seconds (default 240)
  local pod=$1 step=$2; shift 2
  local flag=() vars=()
  for arg in "$@"; do [ "$arg" = --vllm ] && flag=(--vllm) || vars+=("$arg"); done
  local tag=""; [[ " ${vars[*]} " == *" TMAGUARD_MODE=off "* ]] && tag=-guard-off
  [[ " ${vars[*]} " == *" LUPINE_TRACE="* ]] && tag=$tag-trace
  local log="$out/logs/$pod-$step${flag:+-vllm}$tag.log"
  timeout "${STEP_TIMEOUT:-240}" bash $here/pod.sh "$pod" "${vars[@]}" -- python3 $here/check.py "$step" \
    "${flag[@]}" > "$log" 2>&1
  local code=$?
  local line; line=$(grep '^RESULT ' "$log" | tail -1 | cut -c8-)
  [ -n "$line" ] || line="{\"step\": \"$step\", \"vllm\": $([ ${#flag[@]} -gt 0 ] && echo true || echo false), \"ok\": false, \"exit\": $code, \"tail\": $(tail -5 "$log" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()[-600:]))')}"
  echo "{\"pod\": \"$pod\", \"vars\": \"${vars[*]}\", \"result\": $line}" >> "$out/checks.jsonl"
  echo "$pod $step ${flag[*]} ${vars[*]}: exit $code $(echo "$line" | cut -c1-200)"
}

doctor() {  # pod [--active]: the doctor's JSON report and its exit status
  local pod=$1 mode=${2:-}
  timeout 180 bash $here/pod.sh "$pod" -- python3 -m vllm_tmaguard doctor --json $mode \
    > "$out/doctor/$pod${mode:+-active}.json" 2> "$out/doctor/$pod${mode:+-active}.err"
  echo "$pod doctor $mode: exit $? $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
print(r.get("status"), [f["id"] for f in r.get("findings", []) if f.get("severity") in ("error", "warning")])' \
    "$out/doctor/$pod${mode:+-active}.json" 2>&1 | cut -c1-300)"
}

pod_checks() {  # pod
  local pod=$1
  check "$pod" guard
  check "$pod" bindings --vllm TMAGUARD_TRACE=1
  for step in quota torch cublaslt half triton; do check "$pod" "$step"; done
  for step in quota torch cublaslt half triton triton_tma machete; do check "$pod" "$step" --vllm; done
  doctor "$pod"
}
for pod in $pods; do pod_checks "$pod" > "$out/logs/summary-$pod.txt" 2>&1 & done
wait
cat "$out"/logs/summary-*.txt
echo "== without the guard"
for pod in $pods; do [[ $pod == vcuda-fork || $pod == lupine ]] && check "$pod" half TMAGUARD_MODE=off; done
[[ " $pods " == *" vcuda-fork "* ]] && check vcuda-fork guard --vllm TMAGUARD_MODE=off
echo "== the doctor, active (CUDA in child processes)"
for pod in vcuda-fork lupine; do [[ " $pods " == *" $pod "* ]] && doctor "$pod" --active; done
if [[ " $pods " == *" nvshare "* ]]; then
  echo "== nvshare without its scheduler's socket: the guard's record first, then the hang vLLM meets"
  check nvshare+nosocket guard
  STEP_TIMEOUT=30 check nvshare+nosocket torch
  doctor nvshare+nosocket
fi
if [[ " $pods " == *" lupine "* ]] && [ "${TRACE:-1}" = 1 ]; then
  echo "== lupine's fp16 cuBLAS traced (the guard off: the layer alone)"
  check lupine half TMAGUARD_MODE=off LUPINE_TRACE=2
  log=$out/logs/lupine-half-guard-off-trace.log
  grep -c "private export table called" "$log" | sed 's/^/private export table calls: /'
  grep -E "private export table called|missing Driver API|unsupported|NOT_SUPPORTED|801" "$log" | sort | uniq -c |
    sort -rn | head -20
  grep -nE "cuLaunchKernel|cuGetExportTable" "$log" | tail -12
  { head -n 2000 "$log"; echo "[... cut ...]"; tail -n 3000 "$log"; } > "$log.cut" && mv "$log.cut" "$log"
fi
if [ -f .dev/base-1cc570e.tar.xz ] && [ "${COST:-1}" = 1 ]; then
  echo "== the guard's cost per process: this build beside 1cc570e's (bench/guard_cost.py --here --baseline)"
  rm -rf /tmp/base /tmp/base-site && mkdir -p /tmp/base && tar -xJf .dev/base-1cc570e.tar.xz -C /tmp/base
  python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/base-site /tmp/base > "$out/logs/base.log" 2>&1
  for pod in bare vcuda-master; do
    timeout 240 bash $here/pod.sh "$pod" -- python3 bench/guard_cost.py --here --runs "${RUNS:-15}" \
      --baseline /tmp/base-site > "$out/cost-$pod.txt" 2>&1
    echo "$pod:"; tail -4 "$out/cost-$pod.txt"
  done
fi
cp -r "$state/records" "$out/" 2>/dev/null
cp "$state"/*.log "$out/logs/" 2>/dev/null
tar -czf "${OUT:-/tmp}/field-checks.tgz" -C "$state" field
echo "results: $(du -sh "${OUT:-/tmp}/field-checks.tgz" | cut -f1)"
