#!/usr/bin/env bash
# On the Hopper machine, from the repository root: unpacks what prepare.sh made (whichever parts this call
# carried), installs this package into the image's Python (its .pth hook and vLLM plugin entry points),
# makes the model once (E2E_MODEL=0: not). Idempotent: a warm machine keeps $E2E_STATE between calls.
set -euo pipefail
state=${E2E_STATE:-/tmp/e2e}
py=$(command -v python3)
mkdir -p "$state"

unpack() {  # part: its extensions go to their place in the vLLM tree ('@' stands for '/')
  local part=$1 file name
  for file in .dev/e2e/$part/so/*.xz; do
    name=$(basename "$file" .xz)
    xz -dc "$file" > "$state/v25/vllm/${name//@//}"
  done
}
stamp() { echo "$state/.$1-$(ls -l .dev/e2e/$1 .dev/e2e/$1/* | sha1sum | cut -c1-12)"; }
if [ -d .dev/e2e/part1 ] && [ ! -f "$(stamp part1)" ]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$state/site" \
    .dev/e2e/part1/whl/*.whl
  mkdir -p "$state/v25" && tar -xJf .dev/e2e/part1/vllm-py.tar.xz -C "$state/v25"
  unpack part1
  touch "$(stamp part1)"
fi
if [ -d .dev/e2e/part2 ] && [ ! -f "$(stamp part2)" ]; then
  unpack part2
  touch "$(stamp part2)"
fi
"$py" -m pip install -q --no-index --no-deps --no-build-isolation --force-reinstall . > "$state/pip.log" 2>&1 ||
  { cat "$state/pip.log"; exit 1; }
if [ "${E2E_MODEL:-1}" = 1 ] && [ ! -f "$state/model/config.json" ]; then
  PYTHONPATH=$state/site "$py" bench/device/e2e/make_model.py "$state/model"
fi
ls "$state"
