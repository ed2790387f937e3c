#!/usr/bin/env bash
# One device call on a 2-GPU Hopper machine: `vllm serve` with tensor parallel 2 (the API server, the
# EngineCore and one worker per GPU) under tkestack vCUDA master in its real layout and on the bare driver,
# the guard installed and nothing else set; the prompts on each; every process's record (the workers replay
# the EngineCore's verdict). Results: $OUT/real-serve.tgz (as serve.sh).
# usage: bash bench/device/real_layers/tp2.sh   (repository root; carry .dev/e2e/part1 .thirdparty)
set -uo pipefail
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
SERVE_EXTRAS=0 E2E_TP=2 E2E_BUDGET_S=0 E2E_PROMPT_COUNT=${E2E_PROMPT_COUNT:-8} QUOTA=${QUOTA:-$((24 << 30))} \
  bash bench/device/real_layers/serve.sh a vm
