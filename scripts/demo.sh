#!/usr/bin/env bash
# README command 1: builds the environment if needed, then shows vLLM failing on an emulated vCUDA pod
# without the guard and starting with it. `bash scripts/demo.sh doctor`: tmaguard doctor on that pod.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup_env.sh"
exec "$root/.venv/bin/python" "$root/scripts/demo.py" "$@"
