#!/usr/bin/env bash
# One device call: the guard's cost per process (bench/guard_cost.py --here: a pod's first process, the
# full run with cold caches, alternated with later ones, the verdict's replay) in the real layouts, the
# package's import included, the standard library a vLLM process loads imported first. Results: $OUT/cost.tgz.
# usage: bash bench/device/real_layers/cost.sh [POD ...]   (repository root; carry .dev/e2e/part1 .thirdparty)
set -uo pipefail
here=bench/device/real_layers
out=/tmp/cost && rm -rf "$out" && mkdir -p "$out"
bash bench/device/e2e/setup.sh > "$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 1; }
bash $here/build.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
export PYTHONPATH=/tmp/e2e/site:/tmp/e2e/v25:$(pwd)/bench/device
pods=("$@"); [ ${#pods[@]} -gt 0 ] || pods=(bare vcuda-master hami)
for pod in "${pods[@]}"; do
  timeout 240 bash $here/pod.sh "$pod" -- python3 bench/guard_cost.py --here --runs ${RUNS:-20} > "$out/cost-$pod.txt" 2>&1
  echo "$pod:"; tail -2 "$out/cost-$pod.txt"
done
tar -czf "${OUT:-/tmp}/cost.tgz" -C /tmp cost
