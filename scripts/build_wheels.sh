#!/usr/bin/env bash
# Builds the release files into dist/ (or the directory given): the sdist, and from that sdist one
# py3-none-manylinux_2_28 wheel per architecture, x86_64 with gcc and aarch64 with Debian's cross gcc
# (aarch64-linux-gnu-gcc; with --install-cross-compiler, installed with apt-get when missing, else the script
# says how and stops). Each wheel must pass `auditwheel show`: consistent with manylinux_2_28 and no library
# outside the policy. Build tools live in build/wheel-tools.
# usage: bash scripts/build_wheels.sh [--install-cross-compiler] [OUT_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
install_cross=0
if [ "${1:-}" = --install-cross-compiler ]; then install_cross=1; shift; fi
out=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
python=${PYTHON:-python3}
policy=manylinux_2_28
tools="$root/build/wheel-tools"
log="$root/build/build-wheels.log"
declare -A compilers=([x86_64]=gcc [aarch64]=aarch64-linux-gnu-gcc)

# shellcheck source=scripts/steps.sh
source "$root/scripts/steps.sh"

mkdir -p "$root/build"
: >"$log"
echo "Building vllm-tmaguard's sdist and wheels into $out (tools' output: $log)"
if ! command -v aarch64-linux-gnu-gcc >/dev/null; then
  packages="gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
  if [ $install_cross = 0 ] || [ "$(id -u)" != 0 ]; then
    echo "aarch64-linux-gnu-gcc is missing: apt-get install $packages (as root), or rerun with" \
      "--install-cross-compiler as root to have this script do it" >&2
    exit 1
  fi
  step "aarch64 cross compiler (apt-get install gcc-aarch64-linux-gnu)" bash -c \
    "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $packages"
fi

if [ ! -x "$tools/bin/auditwheel" ]; then
  step "build tools (build, setuptools, auditwheel)" bash -c \
    "'$python' -m venv '$tools' && '$tools/bin/pip' install --disable-pip-version-check build 'setuptools>=77' auditwheel"
fi
rm -f "$out"/vllm_tmaguard-*
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step "sdist" "$tools/bin/python" -m build --sdist --no-isolation --outdir "$out" "$root"
sdist=$(ls "$out"/vllm_tmaguard-*.tar.gz)

for arch in x86_64 aarch64; do
  cc=${compilers[$arch]}
  mkdir -p "$work/$arch"  # each wheel from a fresh unpacking of the sdist: no object shared
  tar -xzf "$sdist" -C "$work/$arch" --strip-components=1
  step "wheel ${policy}_$arch from the sdist ($cc)" env CC="$cc" LDSHARED="$cc -shared" \
    "$tools/bin/python" -m build --wheel --no-isolation --outdir "$out" \
    "-C--build-option=--plat-name=${policy}_$arch" "$work/$arch"
done

status=0
for wheel in "$out"/vllm_tmaguard-*.whl; do
  report=$("$tools/bin/auditwheel" show "$wheel" 2>&1) || true
  echo "=== auditwheel show $wheel" >>"$log"
  echo "$report" >>"$log"
  arch=${wheel%.whl}
  arch=${arch##*_2_28_}
  # auditwheel names the most compatible tag the wheel satisfies: manylinux_2_28 or older is what we need.
  glibc=$(sed -n 's/.*platform tag: "manylinux_2_\([0-9]*\)_'"$arch"'".*/\1/p' <<<"$report" | tr -d '\n')
  if [ -n "$glibc" ] && [ "$glibc" -le 28 ] && grep -q "requires no external shared libraries" <<<"$report"; then
    echo "  auditwheel show $(basename "$wheel"): $policy satisfied (manylinux_2_${glibc}), no external libraries"
  else
    echo "  auditwheel show $(basename "$wheel"): FAILED" >&2
    echo "$report" >&2
    status=1
  fi
done
ls -1 "$out"/vllm_tmaguard-*
exit $status
