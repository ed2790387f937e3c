#!/usr/bin/env bash
# Builds the real sharing layers from their source trees (bench/device/real_layers/sources.sh writes them to
# the ignored .thirdparty/, or packs them into .dev/thirdparty.tar.xz to carry; docs/real-layers.md names
# each repository and commit) into $STATE/layers, each the way its own project builds it:
#   vcuda-master/ vcuda-v1.0.5/ libcuda-control.so   tkestack/vcuda-controller (target cuda-control)
#   vcuda-fork/libcuda-control.so                      coldzerofear/vcuda-controller (the CUDA-12 fork)
#   hami-core/ hami-8c32de6/ hami-93cf05d/ libvgpu.so  Project-HAMi/HAMi-core by its build.sh (Debug)
#   vgpu-manager/libvgpu-control.so                    coldzerofear/vgpu-manager library/ (Release)
#   nvshare/libnvshare.so, nvshare-scheduler           grgalex/nvshare src/Makefile
#   lupine/libcuda.so.1, libnvidia-ml.so.1, lupine_driver_server   lupinemachines/lupine (CMake)
# plus vcuda_config (writes vCUDA's resource_data_t) and the gpu-client stub. Idempotent; LAYERS names the
# ones to build (default: all). Off the GPU machine, LINK_CUDA/LINK_NVML name stand-in libraries to link
# HAMi against (a build check only).
# usage: [LAYERS="vcuda-fork lupine"] bash bench/device/real_layers/build.sh   (repository root; $STATE /tmp/rl)
set -euo pipefail
root=$(pwd)
tp=$root/.thirdparty
state=${STATE:-/tmp/rl}
jobs=$(nproc)
mkdir -p "$state/layers"
if [ ! -d "$tp/vcuda-master" ] && [ -f "$root/.dev/thirdparty.tar.xz" ]; then
  mkdir -p "$tp" && tar -xJf "$root/.dev/thirdparty.tar.xz" -C "$tp"
fi
vdpau=$tp/vdpau-dev/usr/include   # Debian's libvdpau-dev header: vCUDA's cuda-subset.h includes it
wanted=" ${LAYERS:-vcuda-master vcuda-v1.0.5 vcuda-fork hami-core hami-8c32de6 hami-93cf05d vgpu-manager nvshare lupine} "
want() { [[ $wanted == *" $1 "* ]] && [ ! -f "$state/layers/$1/$2" ]; }
logged() {  # log command...: quiet on success, the log's tail on failure
  local log=$1; shift
  "$@" > "$log" 2>&1 || { tail -30 "$log"; return 1; }
}
real() {  # the file the loader gives for a library name (the machine's driver)
  python3 -c "import os, sys; from vllm_tmaguard.stages.loader import resolve_library as r
print(os.path.realpath(r(sys.argv[1], {}).path))" "$1"
}

for tree in vcuda-master vcuda-v1.0.5 vcuda-fork; do
  want "$tree" libcuda-control.so || continue
  out=$state/layers/$tree && mkdir -p "$out/build"
  logged "$out/build.log" cmake -S "$tp/$tree" -B "$out/build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="-I$vdpau" -DCMAKE_CXX_FLAGS="-I$vdpau"
  logged "$out/make.log" make -C "$out/build" -j"$jobs" cuda-control
  cp "$out/build/libcuda-control.so" "$out/"
done
[ -x "$state/layers/vcuda_config" ] ||
  gcc -O2 -I"$tp/vcuda-master" -I"$vdpau" -o "$state/layers/vcuda_config" bench/device/real_layers/vcuda_config.c

# HAMi-core the way its own build.sh (and its Dockerfile) builds it: CMAKE_BUILD_TYPE=Debug, which is also
# what exports its hooks (a Release build compiles with -fvisibility=hidden: only dlsym is exported, so its
# dlsym finds none of its own hooks and hands out the driver's, and nothing is metered). It links -lcuda
# -lnvidia-ml and includes nvml.h (from PyPI's nvidia-nvml-dev, carried).
links=$state/layers/link && mkdir -p "$links"
for tree in hami-core hami-8c32de6 hami-93cf05d; do
  want "$tree" libvgpu.so || continue
  [ -e "$links/libcuda.so" ] || ln -sf "${LINK_CUDA:-$(real libcuda.so.1)}" "$links/libcuda.so"
  [ -e "$links/libnvidia-ml.so" ] || ln -sf "${LINK_NVML:-$(real libnvidia-ml.so.1)}" "$links/libnvidia-ml.so"
  out=$state/layers/$tree
  rm -rf "$out" && cp -r "$tp/$tree" "$out"
  cuda_home=${CUDA_HOME:-/usr/local/cuda}
  if [ "$tree" = hami-93cf05d ]; then  # Volcano v1.10.0's pin predates CUDA 13's cuda.h: CUDA 12.8's headers
    cuda_home=$state/layers/cuda12 && mkdir -p "$cuda_home"
    ln -sfn "$tp/cuda12-include" "$cuda_home/include" && ln -sfn "${CUDA_HOME:-/usr/local/cuda}/lib64" "$cuda_home/lib64"
  fi
  (cd "$out" && MAKEFLAGS=-k CUDA_HOME=$cuda_home J=$jobs CMAKE_OPTIONS="-DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      -DCMAKE_C_FLAGS=-I$tp/nvml-include -DCMAKE_SHARED_LINKER_FLAGS=-L$links" logged build.log bash ./build.sh) ||
    echo "$tree: its build stopped (build.log); its test programs may be what failed"
  built=$(find "$out/build" -name libvgpu.so | head -1)
  [ -n "$built" ] || { echo "$tree: no libvgpu.so built"; continue; }
  cp "$built" "$out/"
  nm -D --defined-only "$out/libvgpu.so" | grep -c " T cu" | sed "s/^/$tree libvgpu.so exports cu* functions: /"
done

# vgpu-manager's hook library as its Dockerfile builds it (Release; its build-time hook checks read the
# CUDA headers of a toolkit this build does not need).
if want vgpu-manager libvgpu-control.so; then
  out=$state/layers/vgpu-manager && mkdir -p "$out/build"
  logged "$out/cmake.log" cmake -S "$tp/vgpu-manager/library" -B "$out/build" -DCMAKE_BUILD_TYPE=Release \
    -DVGPU_RUN_HOOK_CHECKS=OFF
  logged "$out/make.log" make -C "$out/build" -j"$jobs" vgpu-control
  cp "$out/build/libvgpu-control.so" "$out/"
fi

if want nvshare libnvshare.so; then
  out=$state/layers/nvshare && rm -rf "$out" && cp -r "$tp/nvshare" "$out"
  logged "$out/make.log" make -C "$out/src" -j"$jobs" libnvshare.so nvshare-scheduler nvsharectl
  cp "$out"/src/{libnvshare.so,nvshare-scheduler,nvsharectl} "$out/"
fi

# lupine: the client (libcuda.so.1, libnvidia-ml.so.1) and the server; nghttp2 (Debian 12's, carried) for
# both, its generated sources as committed (codegen/gen_*), no tests.
if want lupine libcuda.so.1; then
  out=$state/layers/lupine && mkdir -p "$out/build"
  nghttp2=$tp/nghttp2/usr
  logged "$out/cmake.log" cmake -S "$tp/lupine" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
    -DLUPINE_BUILD_HIP=OFF ${LUPINE_CMAKE:-} -DLUPINE_NVML_HEADER_DIR="$tp/nvml-include" -DNGHTTP2_INCLUDE_DIR="$nghttp2/include" \
    -DNGHTTP2_LIBRARY="$nghttp2/lib/x86_64-linux-gnu/libnghttp2.so" \
    -DCMAKE_C_FLAGS="-I$tp/nvml-include" -DCMAKE_CXX_FLAGS="-I$tp/nvml-include"
  logged "$out/make.log" make -C "$out/build" -j"$jobs"
  find "$out/build" -maxdepth 2 \( -name 'libcuda.so*' -o -name 'libnvidia-ml.so*' -o -name 'lupine_driver_server' \
    -o -name '*server' \) -newer "$out/cmake.log" -exec cp -a {} "$out/" \;
  cp -a "$nghttp2"/lib/x86_64-linux-gnu/libnghttp2.so.14* "$out/"   # the client's own dependency
fi

# vCUDA fork+execs /usr/local/nvidia/bin/gpu-client to register the process; the stub logs and exits 0.
printf '#!/bin/sh\necho "$$ $*" >> %s/registrations.log\nexit 0\n' "$state" > "$state/layers/gpu-client"
chmod 755 "$state/layers/gpu-client"
ls -la "$state"/layers/*/*.so* "$state"/layers/lupine/*server* 2>/dev/null || true
