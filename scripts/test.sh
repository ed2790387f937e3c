#!/usr/bin/env bash
# The test command: builds the test environment if needed (scripts/setup_env.sh), lints, runs every test.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup_env.sh"
cd "$root"
.venv/bin/python -m ruff check vllm_tmaguard tests scripts setup.py bench deploy
# In parallel (pytest-xdist): most tests wait on a child process, so each CPU gets a worker and a half
# (TMAGUARD_TEST_WORKERS overrides; 0: one process). worksteal: the long tests do not queue behind each other.
workers=${TMAGUARD_TEST_WORKERS:-$(( ($(nproc) * 3 + 1) / 2 ))}
exec .venv/bin/python -m pytest -q -n "$workers" --dist worksteal "$@"
