#!/usr/bin/env bash
# Runs a command inside one emulated pod, laid out the way each layer's device plugin lays it out, in a
# private mount namespace (the fixed paths a layer reads exist there only):
#   bare          the real driver, nothing else
#   vcuda-master  tkestack vCUDA built from master: libcuda-control.so hard-linked as libcuda.so.1,
#   vcuda-v1.0.5  libcuda.so, libnvidia-ml.so.1, libnvidia-ml.so in a directory first on LD_LIBRARY_PATH,
#                 the real libcuda.so.<ver> and libnvidia-ml.so.<ver> beside them, /etc/vcuda/vcuda.config
#                 (resource_data_t, $QUOTA bytes) and pids.config, /usr/local/nvidia/bin/gpu-client (stub)
#   hami          HAMi-core's libvgpu.so in /etc/ld.so.preload, CUDA_DEVICE_MEMORY_LIMIT_0=$QUOTA_HAMI,
#                 CUDA_DEVICE_SM_LIMIT, CUDA_DEVICE_MEMORY_SHARED_CACHE; the real libcuda.so.1 in place
# A pod's pids.config is kept current by pids_daemon.py (what vCUDA's node daemon does).
# usage: pod.sh POD [NAME=VALUE ...] -- COMMAND ...   (as root; $STATE default /tmp/rl)
set -euo pipefail
pod=$1; shift
state=${STATE:-/tmp/rl}
extra=()
while [ "$1" != "--" ]; do extra+=("$1"); shift; done; shift
dir=$state/pods/$pod
layer=${pod%%+*}   # vcuda-master+noconfig: vCUDA master without its vcuda.config
real() {  # the file the loader gives for a library name outside any pod
  env -u LD_LIBRARY_PATH python3 -c "import os, sys; from vllm_tmaguard.loader import resolve_library as r
print(os.path.realpath(r(sys.argv[1], {}).path))" "$1"
}
# Off the GPU machine (the layers on stand-in libraries, a developer's check): REAL_CUDA, REAL_NVML and
# DRIVER_VERSION name them, and /proc/driver/nvidia/version is made up inside the namespace.
real_cuda=${REAL_CUDA:-$(real libcuda.so.1)}
real_nvml=${REAL_NVML:-$(real libnvidia-ml.so.1)}
version=${DRIVER_VERSION:-$(sed -n 's/.*Kernel Module[^0-9]*\([0-9][0-9.]*\).*/\1/p' /proc/driver/nvidia/version | head -1)}
if [ ! -d "$dir" ]; then
  mkdir -p "$dir/lib"
  cp -a /etc "$dir/etc"   # the pod's own /etc (bind-mounted over /etc in its namespace)
  case $layer in
    vcuda-*)
      cp "$state/layers/$layer/libcuda-control.so" "$dir/lib/"
      for name in libcuda.so.1 libcuda.so libnvidia-ml.so.1 libnvidia-ml.so; do ln "$dir/lib/libcuda-control.so" "$dir/lib/$name"; done
      ln -s "$real_cuda" "$dir/lib/libcuda.so.$version"
      ln -s "$real_nvml" "$dir/lib/libnvidia-ml.so.$version"
      mkdir -p "$dir/etc/vcuda" "$dir/nvidia-bin"
      "$state/layers/vcuda_config" "$dir/etc/vcuda" "${QUOTA:-8589934592}" > /dev/null
      [[ $pod == *+noconfig ]] && rm "$dir/etc/vcuda/vcuda.config"
      cp "$state/layers/gpu-client" "$dir/nvidia-bin/gpu-client"
      ;;
    hami)
      echo "$state/layers/hami/libvgpu.so" > "$dir/etc/ld.so.preload"
      ;;
  esac
fi
env_vars=(PATH="$PATH" HOME=/root PYTHONUNBUFFERED=1 TMAGUARD_RECORD_DIR="${TMAGUARD_RECORD_DIR:-$state/records/$pod}")
[ -n "${PYTHONPATH:-}" ] && env_vars+=(PYTHONPATH="$PYTHONPATH")
case $layer in
  vcuda-*) env_vars+=(LD_LIBRARY_PATH="$dir/lib") ;;
  hami) env_vars+=(CUDA_DEVICE_MEMORY_LIMIT_0="${QUOTA_HAMI:-8g}" CUDA_DEVICE_SM_LIMIT=100
                   CUDA_DEVICE_MEMORY_SHARED_CACHE="$dir/hami.cache") ;;
esac
mounts="mount --bind $dir/etc /etc"
if [ -n "${DRIVER_VERSION:-}" ]; then
  mounts+="; mount -t tmpfs none /proc/driver; mkdir -p /proc/driver/nvidia"
  mounts+="; echo 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  $version  (made up)' > /proc/driver/nvidia/version"
fi
if [[ $layer == vcuda-* ]]; then
  # /usr/local/nvidia/bin may not exist, or be read-only: an overlay (or a bind) gives it gpu-client.
  if [ -d /usr/local/nvidia/bin ]; then
    mkdir -p "$dir/nv-up" "$dir/nv-work"
    cp "$dir/nvidia-bin/gpu-client" "$dir/nv-up/"
    mounts+="; mount -t overlay overlay -o lowerdir=/usr/local/nvidia/bin,upperdir=$dir/nv-up,workdir=$dir/nv-work /usr/local/nvidia/bin"
  else
    mkdir -p /usr/local/nvidia/bin 2>/dev/null || true
    mounts+="; mount --bind $dir/nvidia-bin /usr/local/nvidia/bin"
  fi
  python3 "$(dirname "$0")/pids_daemon.py" "$dir/etc/vcuda/pids.config" $$ &
  daemon=$!
  trap 'kill $daemon 2>/dev/null' EXIT
fi
unshare -m --propagation private bash -c "$mounts; exec env -i ${env_vars[*]@Q} ${extra[*]@Q} \"\$@\"" pod "$@"
