#!/usr/bin/env bash
# The test command: builds the test environment if needed (scripts/setup_env.sh), lints, runs every test.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup_env.sh"
cd "$root"
.venv/bin/python -m ruff check vllm_tmaguard tests scripts setup.py bench deploy
exec .venv/bin/python -m pytest -q "$@"
