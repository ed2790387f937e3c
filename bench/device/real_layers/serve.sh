#!/usr/bin/env bash
# One device call: `vllm serve` (vLLM 0.25.1, the e2e model, bench/device/e2e/) under the real layers, each in
# its real layout with the guard installed and nothing else set, beside two bare pods (the second one is the
# noise floor); then the prompts and vLLM's serving benchmark across the pods (serve_pods.py). Results:
# $OUT/real-serve.tgz.
# usage: bash bench/device/real_layers/serve.sh [POD ...]   (repository root; carry .dev/e2e/part1 .thirdparty)
set -uo pipefail
export PYTHONUNBUFFERED=1
pods=("$@"); [ ${#pods[@]} -gt 0 ] || pods=(a vm v105 hami a2)
here=bench/device/real_layers
state=${STATE:-/tmp/rl}
out=$state/serve-extra && rm -rf "$out" && mkdir -p "$out"
bash bench/device/e2e/setup.sh > "$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 1; }
bash $here/build.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
export PYTHONPATH=/tmp/e2e/site:/tmp/e2e/v25:$(pwd)/bench/device

if [ "${SERVE_EXTRAS:-1}" = 1 ]; then  # SERVE_EXTRAS=0: the serving run alone
  echo "== HAMi-core: its quota without the guard, and which file answers what the CUDA runtime binds"
  for run in "hami quota TMAGUARD_MODE=off" "hami bindings" "vcuda-master bindings" "bare bindings"; do
    set -- $run
    timeout 120 bash $here/pod.sh "$1" "${@:3}" LOGGER_LEVEL=0 -- python3 $here/check.py "$2" > "$out/$1-$2${3:+-off}.log" 2>&1
    echo "$run: $(grep '^RESULT' "$out/$1-$2${3:+-off}.log" | cut -c8-700)"
  done
  echo "== the guard's cost per process, and its import (bench/guard_cost.py --here; python -X importtime)"
  for pod in bare vcuda-master; do
    timeout 180 bash $here/pod.sh "$pod" -- python3 bench/guard_cost.py --here --runs 20 > "$out/cost-$pod.txt" 2>&1
    echo "$pod:"; tail -2 "$out/cost-$pod.txt"
  done
  bash $here/pod.sh bare -- python3 -X importtime -c "import vllm_tmaguard.guard" 2> "$out/importtime.txt"
  grep vllm_tmaguard "$out/importtime.txt" | tail -3
fi
E2E_PROMPT_COUNT=${E2E_PROMPT_COUNT:-16} E2E_PROMPT_SCALE=${E2E_PROMPT_SCALE:-0.5} E2E_BUDGET_S=${E2E_BUDGET_S:-400} \
  python3 bench/device/e2e/serve_pods.py "${pods[@]}"
cp -r "$out" /tmp/e2e/results/extra 2>/dev/null
tar -czf "${OUT:-/tmp}/real-serve.tgz" -C /tmp/e2e results
echo "results: $(du -sh "${OUT:-/tmp}/real-serve.tgz" | cut -f1)"
