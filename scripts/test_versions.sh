#!/usr/bin/env bash
# The version matrix: the guard with every vLLM release in tests/versions/releases.py (real wheels, each in
# its own venv under .versions/, built or reused), on emulated pods; writes docs/compat.md.
#   bash scripts/test_versions.sh              # every release
#   bash scripts/test_versions.sh 0.8.5 0.33.0  # some releases (the others' cells in docs/compat.md stay)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup_env.sh  # .venv: the test tools and the default release
start=$(date +%s)
.venv/bin/python tests/versions/build_envs.py "$@"
built=$(date +%s)
releases=$(IFS=,; echo "$*")
status=0
TMAGUARD_RELEASES=$releases .venv/bin/python -m pytest -q -p no:cacheprovider tests/versions/check_matrix.py \
  || status=$?
done=$(date +%s)
.venv/bin/python tests/versions/compat_doc.py --build-seconds $((built - start)) --test-seconds $((done - built)) \
  ${releases:+--partial}
echo "version matrix: release venvs $((built - start)) s, matrix $((done - built)) s; docs/compat.md written"
exit $status
