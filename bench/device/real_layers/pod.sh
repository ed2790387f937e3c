#!/usr/bin/env bash
# Runs a command inside one emulated pod, laid out the way each layer's device plugin lays it out, in a
# private mount namespace (the fixed paths a layer reads exist there only):
#   bare          the real driver, nothing else
#   vcuda-master  tkestack vCUDA built from master: libcuda-control.so hard-linked as libcuda.so.1,
#   vcuda-v1.0.5  libcuda.so, libnvidia-ml.so.1, libnvidia-ml.so in a directory first on LD_LIBRARY_PATH,
#                 the real libcuda.so.<ver> and libnvidia-ml.so.<ver> beside them, /etc/vcuda/vcuda.config
#                 (resource_data_t, $QUOTA bytes) and pids.config, /usr/local/nvidia/bin/gpu-client (stub);
#                 POD+noconfig: the same without vcuda.config
#   hami          HAMi-core's /usr/local/vgpu/libvgpu.so in /etc/ld.so.preload, CUDA_DEVICE_MEMORY_LIMIT_0
#                 ($QUOTA_HAMI), CUDA_DEVICE_SM_LIMIT, CUDA_DEVICE_MEMORY_SHARED_CACHE (one per limit: HAMi keeps
#                 the first limit in it), the real libcuda.so.1
# A vCUDA pod's pids.config is kept current by pids_daemon.py (what vCUDA's node daemon does).
# usage: pod.sh POD [NAME=VALUE ...] -- COMMAND ...   (as root; $STATE default /tmp/rl)
# Off the GPU machine (real layers on stand-in libraries): REAL_CUDA, REAL_NVML and DRIVER_VERSION name
# them, and /proc/driver/nvidia/version is made up inside the namespace.
set -euo pipefail
pod=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
state=${STATE:-/tmp/rl}
extra=()
while [ "$1" != "--" ]; do extra+=("$1"); shift; done; shift
dir=$state/pods/$pod
layer=${pod%%+*}
real() {  # the file the loader gives for a library name outside any pod
  env -u LD_LIBRARY_PATH python3 -c "import os, sys; from vllm_tmaguard.loader import resolve_library as r
print(os.path.realpath(r(sys.argv[1], {}).path))" "$1"
}
real_cuda=${REAL_CUDA:-$(real libcuda.so.1)}
real_nvml=${REAL_NVML:-$(real libnvidia-ml.so.1)}
version=${DRIVER_VERSION:-$(grep -m1 NVRM /proc/driver/nvidia/version | grep -oE '\b[0-9]+\.[0-9]+(\.[0-9]+)*\b' | head -1)}
if [ ! -d "$dir" ]; then
  mkdir -p "$dir/lib"
  cp -a /etc "$dir/etc"   # the pod's own /etc (bind-mounted over /etc in its namespace)
  case $layer in
    vcuda-*)
      cp "$state/layers/$layer/libcuda-control.so" "$dir/lib/"
      for name in libcuda.so.1 libcuda.so libnvidia-ml.so.1 libnvidia-ml.so; do ln "$dir/lib/libcuda-control.so" "$dir/lib/$name"; done
      ln -s "$real_cuda" "$dir/lib/libcuda.so.$version"
      ln -s "$real_nvml" "$dir/lib/libnvidia-ml.so.$version"
      mkdir -p "$dir/etc/vcuda"
      ;;
    hami)
      echo /usr/local/vgpu/libvgpu.so > "$dir/etc/ld.so.preload"
      ;;
  esac
fi
if [[ $layer == vcuda-* ]]; then  # this call's quota, also in a pod a warm machine kept from an earlier call
  "$state/layers/vcuda_config" "$dir/etc/vcuda" "${QUOTA:-8589934592}" > /dev/null
  if [[ $pod == *+noconfig ]]; then rm "$dir/etc/vcuda/vcuda.config"; fi
fi
added=()  # files the device plugin puts in place, SOURCE:TARGET
case $layer in
  vcuda-*) added+=("$state/layers/gpu-client:/usr/local/nvidia/bin/gpu-client") ;;
  hami) added+=("$state/layers/hami-core/libvgpu.so:/usr/local/vgpu/libvgpu.so") ;;
esac
vars=(PATH="$PATH" HOME=/root PYTHONUNBUFFERED=1 TMAGUARD_RECORD_DIR="${TMAGUARD_RECORD_DIR:-$state/records/$pod}")
[ -n "${PYTHONPATH:-}" ] && vars+=(PYTHONPATH="$PYTHONPATH")
case $layer in
  vcuda-*) vars+=(LD_LIBRARY_PATH="$dir/lib") ;;
  hami) vars+=(CUDA_DEVICE_MEMORY_LIMIT_0="${QUOTA_HAMI:-8g}" CUDA_DEVICE_SM_LIMIT=100
               CUDA_DEVICE_MEMORY_SHARED_CACHE="$dir/hami-${QUOTA_HAMI:-8g}.cache") ;;
esac
if [[ $layer == vcuda-* ]]; then
  python3 "$here/pids_daemon.py" "$dir/etc/vcuda/pids.config" $$ &
  trap "kill $! 2>/dev/null" EXIT
fi
unshare -m --propagation private bash "$here/namespace.sh" "$dir" "$version" ${DRIVER_VERSION:+made-up-proc} \
  "${added[@]}" -- env -i "${vars[@]}" "${extra[@]}" "$@"
