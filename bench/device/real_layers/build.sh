#!/usr/bin/env bash
# Builds the real sharing layers from their source trees (fetched on the preparing machine into the ignored
# .thirdparty/ and carried; docs/real-layers.md names each repository and commit) into $STATE/layers:
#   vcuda-master/libcuda-control.so, vcuda-v1.0.5/libcuda-control.so   tkestack/vcuda-controller
#   hami-core/libvgpu.so                                                 Project-HAMi/HAMi-core
# plus vcuda_config (writes vCUDA's resource_data_t) and the gpu-client stub. Idempotent.
# usage: bash bench/device/real_layers/build.sh   (repository root; $STATE default /tmp/rl)
set -euo pipefail
root=$(pwd)
tp=$root/.thirdparty
state=${STATE:-/tmp/rl}
mkdir -p "$state/layers"
vdpau=$tp/vdpau-dev/usr/include   # Debian's libvdpau-dev header: vCUDA's cuda-subset.h includes it
for tree in vcuda-master vcuda-v1.0.5; do
  out=$state/layers/$tree
  [ -f "$out/libcuda-control.so" ] && continue
  mkdir -p "$out/build"
  (cd "$out/build" && cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-I$vdpau" "$tp/$tree" > cmake.log &&
    make -j8 cuda-control > make.log) || { tail -20 "$out/build/make.log"; exit 1; }
  cp "$out/build/libcuda-control.so" "$out/"
done
gcc -O2 -I"$tp/vcuda-master" -I"$vdpau" -o "$state/layers/vcuda_config" bench/device/real_layers/vcuda_config.c

# HAMi-core the way its own build.sh (and its Dockerfile) builds it: CMAKE_BUILD_TYPE=Debug, which is also
# what exports its hooks (a Release build compiles with -fvisibility=hidden: only dlsym is exported, so its
# dlsym finds none of its own hooks and hands out the driver's, and nothing is metered). It links -lcuda
# -lnvidia-ml and includes nvml.h (from PyPI's nvidia-nvml-dev, carried).
hami=$state/layers/hami-core
if [ ! -f "$hami/libvgpu.so" ]; then
  real() {
    python3 -c "import os, sys; from vllm_tmaguard.loader import resolve_library as r
print(os.path.realpath(r(sys.argv[1], {}).path))" "$1"
  }
  real_cuda=$(real libcuda.so.1)
  real_nvml=$(real libnvidia-ml.so.1)
  links=$state/layers/hami-link && mkdir -p "$links"
  ln -sf "$real_cuda" "$links/libcuda.so"; ln -sf "$real_nvml" "$links/libnvidia-ml.so"
  rm -rf "$hami" && cp -r "$tp/hami-core" "$hami"
  (cd "$hami" && CUDA_HOME=/usr/local/cuda J=8 CMAKE_OPTIONS="-DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      -DCMAKE_C_FLAGS=-I$tp/nvml-include -DCMAKE_SHARED_LINKER_FLAGS=-L$links" sh ./build.sh > build.log 2>&1) ||
    { tail -20 "$hami/build.log"; exit 1; }
  cp "$(find "$hami/build" -name libvgpu.so | head -1)" "$hami/"
fi
nm -D --defined-only "$hami/libvgpu.so" | grep -c " T cu" | sed 's/^/libvgpu.so exports cu* functions: /'
# vCUDA fork+execs /usr/local/nvidia/bin/gpu-client to register the process; the stub logs and exits 0.
printf '#!/bin/sh\necho "$$ $*" >> %s/registrations.log\nexit 0\n' "$state" > "$state/layers/gpu-client"
chmod 755 "$state/layers/gpu-client"
ls -la "$state"/layers/*/*.so
