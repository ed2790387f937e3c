#!/usr/bin/env bash
# One device call of the end-to-end run (Hopper machine, repository root): set-up (idempotent), then the
# named pods in order; the results so far come back as $OUT/e2e-results.tgz.
# usage: bash bench/device/e2e/run.sh [POD ...]   (pods: bench/device/e2e/serve_pods.py PODS)
set -uo pipefail
export PYTHONUNBUFFERED=1
bash bench/device/e2e/setup.sh || exit 1
[ $# -eq 0 ] || python3 bench/device/e2e/serve_pods.py "$@"
tar -czf "${OUT:-/tmp}/e2e-results.tgz" -C "${E2E_STATE:-/tmp/e2e}" results 2>/dev/null
echo "results: $(du -sh "${OUT:-/tmp}/e2e-results.tgz" | cut -f1)"
