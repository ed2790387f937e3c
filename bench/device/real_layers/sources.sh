#!/usr/bin/env bash
# On the preparing machine (network, the fetch tool's mirrors): writes what build.sh needs into the ignored
# .thirdparty/ (carried to the GPU machine, never committed). Each layer at the commit docs/real-layers.md
# names, exported from a mirror made by fetching github.com/OWNER/NAME (MIRRORS: where those are, one
# OWNER+NAME/repo git directory each), plus the headers and libraries the GPU machine lacks. Idempotent.
# usage: bash bench/device/real_layers/sources.sh   (repository root; writes .dev/thirdparty.tar.xz too)
set -euo pipefail
mirrors=${MIRRORS:-/work/.mirror}
tp=$(pwd)/.thirdparty
mkdir -p "$tp"

export_tree() {  # directory repository commit [path inside]
  local into=$tp/$1 git_dir=$mirrors/$2/repo
  [ -d "$into" ] && return
  git --git-dir="$git_dir" rev-parse --verify -q "$3^{commit}" > /dev/null ||
    { echo "no commit $3 in $git_dir: fetch github:${2/+//} first" >&2; exit 1; }
  mkdir -p "$into.part"
  git --git-dir="$git_dir" archive "$3" ${4:-} | tar -x -C "$into.part"
  mv "$into.part" "$into"
  echo "$1: ${2/+//} $3 ${4:-}"
}
export_tree vcuda-master tkestack+vcuda-controller 72e0115
export_tree vcuda-v1.0.5 tkestack+vcuda-controller 4f599c8
export_tree vcuda-fork coldzerofear+vcuda-controller ec4dee1
export_tree hami-core Project-HAMi+HAMi-core 8f3a89c
export_tree hami-8c32de6 Project-HAMi+HAMi-core 8c32de6   # volcano-vgpu-device-plugin v1.12.0's pin
export_tree hami-93cf05d Project-HAMi+HAMi-core 93cf05d   # volcano-vgpu-device-plugin v1.10.0's pin
export_tree vgpu-manager coldzerofear+vgpu-manager 3d7f66d library
export_tree nvshare grgalex+nvshare 1a8f211 src
export_tree lupine lupinemachines+lupine 7fbd364
# lupine's tests and deploy files are not built; its third_party/ is (header-only libraries).
rm -rf "$tp/lupine/test" "$tp/lupine/deploy" "$tp/lupine/.github"

debian() {  # directory package...: Debian 12's packages unpacked (headers, and nghttp2's library)
  local into=$tp/$1; shift
  [ -d "$into" ] && return
  mkdir -p "$into.part" && (cd "$into.part" && apt-get download "$@" > /dev/null && for deb in *.deb; do
    dpkg -x "$deb" .; done && rm -f ./*.deb)
  mv "$into.part" "$into"
  echo "$(basename "$into"): Debian $*"
}
debian vdpau-dev libvdpau-dev          # vCUDA's cuda-subset.h includes vdpau/vdpau.h
debian nghttp2 libnghttp2-dev libnghttp2-14   # lupine's client (the GPU machine has no nghttp2)
if [ ! -d "$tp/nvml-include" ]; then    # HAMi-core and lupine include nvml.h (not in the CUDA toolkit)
  work=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$work" nvidia-nvml-dev==13.0.87
  (cd "$work" && python3 -m zipfile -e ./*.whl x)
  mkdir -p "$tp/nvml-include" && cp "$(find "$work/x" -name nvml.h | head -1)" "$tp/nvml-include/"
  rm -rf "$work"
  echo "nvml-include: PyPI nvidia-nvml-dev 13.0.87"
fi
if [ ! -d "$tp/cuda12-include" ]; then  # HAMi-core 93cf05d predates CUDA 13's cuda.h (cuMemPrefetchAsync_v2)
  work=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$work" nvidia-cuda-runtime-cu12==12.8.90
  (cd "$work" && python3 -m zipfile -e ./*.whl x)
  mkdir -p "$tp/cuda12-include" && cp -r "$work"/x/nvidia/cuda_runtime/include/. "$tp/cuda12-include/"
  rm -rf "$work" "$tp/cuda12-include/__init__.py"
  echo "cuda12-include: PyPI nvidia-cuda-runtime-cu12 12.8.90"
fi
# One compressed file to carry (a device call carries 64 MiB in all; the trees are ~18 MB, packed ~2 MB).
mkdir -p .dev && tar --exclude=./research -cJf .dev/thirdparty.tar.xz -C "$tp" .
du -sh "$tp" .dev/thirdparty.tar.xz
