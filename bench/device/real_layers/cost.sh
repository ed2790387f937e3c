#!/usr/bin/env bash
# One device call: the guard's cost per process (bench/guard_cost.py --here: a pod's first process, the
# full run with cold caches, alternated with later ones, the verdict's replay) in the real layouts, the
# package's import included, the standard library a vLLM process loads imported first; then where a later
# process's time goes (bench/replay_steps.py, step by step) and what each module's import costs
# (bench/import_cost.py; bench/import_parts.py: its finder, byte code and execution). With
# .dev/baseline-LABEL.tar.xz carried (another commit's package, `pip install --target`, packed; LABEL names
# its rows, e.g. the commit), every process of each such build alternates with this one's (--baseline), so
# all rows come from the same minutes.
# usage: [LAYERS=...] [PROFILE=1] bash bench/device/real_layers/cost.sh [POD ...]
#        (repository root; carry .dev/e2e/part1 .dev/thirdparty.tar.xz [.dev/baseline-*.tar.xz])
set -uo pipefail
here=bench/device/real_layers
out=${OUT:-/tmp}/cost && rm -rf "$out" && mkdir -p "$out"
pods=("$@"); [ ${#pods[@]} -gt 0 ] || pods=(bare vcuda-master hami)
bash bench/device/e2e/setup.sh > "$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 1; }
LAYERS=${LAYERS:-vcuda-master hami-core} bash $here/build.sh > "$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
baseline=()
for packed in .dev/baseline-*.tar.xz; do  # each an earlier commit's package (pip install --target), by label
  [ -f "$packed" ] || continue
  label=$(basename "$packed" .tar.xz); label=${label#baseline-}
  rm -rf "/tmp/base-$label" && mkdir -p "/tmp/base-$label" && tar -xJf "$packed" -C "/tmp/base-$label"
  baseline+=(--baseline "$label=/tmp/base-$label")
done
export PYTHONPATH=/tmp/e2e/site:/tmp/e2e/v25:$(pwd)/bench/device
for pod in "${pods[@]}"; do
  timeout 240 bash $here/pod.sh "$pod" -- python3 bench/guard_cost.py --here --runs "${RUNS:-20}" "${baseline[@]}" \
    > "$out/cost-$pod.txt" 2>&1
  timeout 120 bash $here/pod.sh "$pod" -- python3 bench/replay_steps.py --runs "${RUNS:-20}" \
    > "$out/steps-$pod.txt" 2>&1
  timeout 120 bash $here/pod.sh "$pod" -- python3 bench/import_cost.py --runs 10 > "$out/imports-$pod.txt" 2>&1
  timeout 120 bash $here/pod.sh "$pod" -- python3 bench/import_parts.py > "$out/import-parts-$pod.txt" 2>&1
  if [ "${PROFILE:-0}" = 1 ]; then  # a first process's functions (bench/full_run_profile.py)
    timeout 120 bash $here/pod.sh "$pod" -- python3 bench/full_run_profile.py --runs 5 > "$out/profile-$pod.txt" 2>&1
  fi
  echo "$pod:"; tail -4 "$out/cost-$pod.txt"; cat "$out/steps-$pod.txt" "$out/imports-$pod.txt" "$out/import-parts-$pod.txt"
done
