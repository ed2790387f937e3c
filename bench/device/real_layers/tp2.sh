#!/usr/bin/env bash
# One device call on a 2-GPU Hopper machine: `vllm serve` with tensor parallel 2 (the API server, the
# EngineCore and one worker per GPU) in the named pods (default: bare and HAMi-core at Volcano v1.12.0's pin), each layer in
# its real layout with the guard installed and nothing else set; the prompts on each; every process's record
# (the workers replay the EngineCore's verdict); with E2E_PROBE=1 (the default here) each process with a CUDA
# context says what cudaMemGetInfo shows it and whether an allocation past the limit is refused
# (bench/device/e2e/probe/). Each layer's device plugin gives the pod both GPUs (POD_GPUS=2, pod.sh).
# Results: $OUT/real-serve.tgz (as serve.sh).
# usage: bash bench/device/real_layers/tp2.sh [POD ...]   (repository root; carry .dev/e2e/part1
#        .dev/thirdparty.tar.xz)
set -uo pipefail
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
[ $# -gt 0 ] || set -- a hv12
POD_GPUS=2 SERVE_EXTRAS=0 E2E_TP=2 E2E_PROBE=${E2E_PROBE:-1} E2E_BUDGET_S=${E2E_BUDGET_S:-0} \
  E2E_PROMPT_COUNT=${E2E_PROMPT_COUNT:-8} QUOTA=${QUOTA:-$((24 << 30))} bash bench/device/real_layers/serve.sh "$@"
