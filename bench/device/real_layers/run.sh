#!/usr/bin/env bash
# One device call: the real sharing layers (build.sh), each in its real layout (pod.sh), with this package
# installed and nothing else set; every check of check.py in its own process. Results: $OUT/real-checks.tgz
# (checks.jsonl: one RESULT per process; logs/; records/; registrations.log; cost-<pod>.txt: the guard's
# own cost per process, bench/guard_cost.py).
# usage: [PODS="hami ..."] bash bench/device/real_layers/run.sh   (repository root; carry .dev/e2e/part1 .thirdparty)
set -uo pipefail
export PYTHONUNBUFFERED=1
here=bench/device/real_layers
state=${STATE:-/tmp/rl}
out=$state/results && rm -rf "$out" "$state/records" && mkdir -p "$out/logs"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
E2E_MODEL=0 bash bench/device/e2e/setup.sh > "$out/logs/setup.log" 2>&1 || { tail -30 "$out/logs/setup.log"; exit 1; }
bash $here/build.sh > "$out/logs/build.log" 2>&1 || { tail -30 "$out/logs/build.log"; exit 1; }
export PYTHONPATH=/tmp/e2e/site:/tmp/e2e/v25:$(pwd)/bench/device
: > "$state/registrations.log"

check() {  # pod step [--vllm] [NAME=VALUE ...]
  local pod=$1 step=$2; shift 2
  local flag=() vars=()
  for arg in "$@"; do [ "$arg" = --vllm ] && flag=(--vllm) || vars+=("$arg"); done
  local tag=""; [[ " ${vars[*]} " == *" TMAGUARD_MODE=off "* ]] && tag=-guard-off
  local log="$out/logs/$pod-$step${flag:+-vllm}$tag.log"
  timeout 240 bash $here/pod.sh "$pod" "${vars[@]}" -- python3 $here/check.py "$step" "${flag[@]}" > "$log" 2>&1
  local code=$?
  local line; line=$(grep '^RESULT ' "$log" | tail -1 | cut -c8-)
  [ -n "$line" ] || line="{\"step\": \"$step\", \"vllm\": $([ ${#flag[@]} -gt 0 ] && echo true || echo false), \"ok\": false, \"exit\": $code, \"tail\": $(tail -5 "$log" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()[-600:]))')}"
  echo "{\"pod\": \"$pod\", \"vars\": \"${vars[*]}\", \"result\": $line}" >> "$out/checks.jsonl"
  echo "$pod $step ${flag[*]} ${vars[*]}: exit $code $(echo "$line" | cut -c1-160)"
}

pod_checks() {  # pod
  local pod=$1
  check "$pod" guard
  for step in quota torch cublaslt triton; do check "$pod" "$step" TMAGUARD_TRACE=1 LOGGER_LEVEL=4 LIBCUDA_LOG_LEVEL=4; done
  for step in quota torch cublaslt triton triton_tma machete; do check "$pod" "$step" --vllm LOGGER_LEVEL=4; done
}
for pod in ${PODS:-bare vcuda-master vcuda-v1.0.5 hami}; do pod_checks "$pod" > "$out/logs/summary-$pod.txt" 2>&1 & done
wait
cat "$out"/logs/summary-*.txt
echo "== guard off, vCUDA master (the failures the guard exists for)"
check vcuda-master torch TMAGUARD_MODE=off
check vcuda-master guard --vllm TMAGUARD_MODE=off
echo "== no layer init by the guard or tmaguard check: registrations, and a pod whose vCUDA has no config"
before=$(wc -l < "$state/registrations.log")
bash $here/pod.sh vcuda-master -- tmaguard check > "$out/logs/tmaguard-check.log" 2>&1; echo "tmaguard check: exit $?"
echo "registrations by tmaguard check: $(( $(wc -l < "$state/registrations.log") - before ))"
check vcuda-master+noconfig guard
echo "== the guard's cost per process: import plus activation (bench/guard_cost.py --here)"
for pod in bare vcuda-master; do
  timeout 180 bash $here/pod.sh "$pod" -- python3 bench/guard_cost.py --here --runs 20 > "$out/cost-$pod.txt" 2>&1
  echo "$pod:"; tail -2 "$out/cost-$pod.txt"
done
cp "$state/registrations.log" "$out/"; cp -r "$state/records" "$out/" 2>/dev/null
tar -czf "${OUT:-/tmp}/real-checks.tgz" -C "$state" results
echo "results: $(du -sh "${OUT:-/tmp}/real-checks.tgz" | cut -f1)"
