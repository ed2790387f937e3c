#!/usr/bin/env bash
# One device call: `vllm serve` (vLLM 0.25.1, the e2e model, bench/device/e2e/) under the real layers, each in
# its real layout with the guard installed and nothing else set, beside two bare pods (the second one is the
# noise floor); then the prompts and vLLM's serving benchmark across the pods (serve_pods.py). Results:
# $OUT/real-serve.tgz.
# usage: bash bench/device/real_layers/serve.sh [POD ...]   (repository root; carry .dev/e2e/part1 .thirdparty)
set -uo pipefail
export PYTHONUNBUFFERED=1
here=bench/device/real_layers
state=${STATE:-/tmp/rl}
out=$state/serve-extra && rm -rf "$out" && mkdir -p "$out"
bash bench/device/e2e/setup.sh > "$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 1; }
bash $here/build.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
export PYTHONPATH=/tmp/e2e/site:/tmp/e2e/v25:$(pwd)/bench/device

pods=("$@"); [ ${#pods[@]} -gt 0 ] || pods=(a vm v105 hami a2)
E2E_PROMPT_COUNT=${E2E_PROMPT_COUNT:-16} E2E_PROMPT_SCALE=${E2E_PROMPT_SCALE:-0.5} E2E_BUDGET_S=${E2E_BUDGET_S:-400} \
  python3 bench/device/e2e/serve_pods.py "${pods[@]}"
cp -r "$out" /tmp/e2e/results/extra 2>/dev/null
tar -czf "${OUT:-/tmp}/real-serve.tgz" -C /tmp/e2e results
echo "results: $(du -sh "${OUT:-/tmp}/real-serve.tgz" | cut -f1)"
