#!/usr/bin/env bash
# Runs a command inside one emulated pod, laid out the way each layer's device plugin lays it out, in a
# private mount namespace (the fixed paths a layer reads exist there only):
#   bare          the real driver, nothing else
#   vcuda-master  tkestack vCUDA built from master: libcuda-control.so hard-linked as libcuda.so.1,
#   vcuda-v1.0.5  libcuda.so, libnvidia-ml.so.1, libnvidia-ml.so in a directory first on LD_LIBRARY_PATH,
#                 the real libcuda.so.<ver> and libnvidia-ml.so.<ver> beside them, /etc/vcuda/vcuda.config
#                 (resource_data_t, $QUOTA bytes) and pids.config, /usr/local/nvidia/bin/gpu-client (stub);
#                 POD+noconfig: the same without vcuda.config; POD+whole: vcuda.config as gpu-manager
#                 writes it for a container of $POD_GPUS whole GPUs (enable 0: no limit). Not a device
#                 plugin's layout: gpu-manager mounts NVIDIA's own driver for whole GPUs and the vCUDA library
#                 only for a share of one GPU; this is the layer's library left in front of whole GPUs (an
#                 image that bakes it in), the only way to run its hooks under tensor parallel
#   vcuda-fork    the same layout with the CUDA-12 fork's libcuda-control.so (coldzerofear/vcuda-controller)
#   hami          HAMi-core's /usr/local/vgpu/libvgpu.so in /etc/ld.so.preload, CUDA_DEVICE_MEMORY_LIMIT_0
#                 ($QUOTA_HAMI), CUDA_DEVICE_SM_LIMIT, CUDA_DEVICE_MEMORY_SHARED_CACHE (one per limit: HAMi keeps
#                 the first limit in it), the real libcuda.so.1; hami-8c32de6, hami-93cf05d: Volcano's pins
#   vgpu-manager  /etc/vgpu-manager/driver/libvgpu-control.so in /etc/ld.so.preload, CUDA_MEM_LIMIT_<i> ($QUOTA
#                 in MiB) and MANAGER_VISIBLE_DEVICES (their UUIDs) for the pod's $POD_GPUS GPUs, host
#                 compatibility mode, its config directory (it writes vgpu.config from the variables), the
#                 real libcuda.so.1
#   nvshare       LD_PRELOAD=/usr/lib/nvshare/libnvshare.so, its scheduler's socket /var/run/nvshare (the
#                 scheduler started once per machine; POD+nosocket: a pod whose socket directory is empty),
#                 libcuda.so (it dlopens the unversioned name) on LD_LIBRARY_PATH
#   lupine        the client libcuda.so.1 / libnvidia-ml.so.1 first on LD_LIBRARY_PATH, LUPINE_SERVER at the
#                 server started once per machine on loopback, LUPINE_DISABLE_LOCAL=1 (every call remote: a
#                 GPU over IP; lupine otherwise serves device 0 from a local driver it finds itself)
# A vCUDA pod's pids.config is kept current by pids_daemon.py (what vCUDA's node daemon does).
# usage: pod.sh POD [NAME=VALUE ...] -- COMMAND ...   (as root; $STATE default /tmp/rl; $POD_GPUS: how many
#        GPUs the device plugin gives the pod, default 1, for the layers whose layout names them;
#        POD_SHM=1: the pod's own /dev/shm, a tmpfs that every call for this POD shares and no other pod
#        sees, as a container runtime gives each pod; without it every pod shares the machine's /dev/shm,
#        and vLLM, which tells nodes apart by whether a shared-memory segment is visible, takes two pods
#        for one node)
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
gpus=${POD_GPUS:-1}
real() {  # the file the loader gives for a library name outside any pod
  env -u LD_LIBRARY_PATH python3 -c "import os, sys; from vllm_tmaguard.stages.loader import resolve_library as r
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
    hami*)
      echo /usr/local/vgpu/libvgpu.so > "$dir/etc/ld.so.preload"
      ;;
    vgpu-manager)
      mkdir -p "$dir/etc/vgpu-manager/driver" "$dir/etc/vgpu-manager/config"
      cp "$state/layers/vgpu-manager/libvgpu-control.so" "$dir/etc/vgpu-manager/driver/"
      ln -s /proc "$dir/etc/vgpu-manager/.host_proc"
      echo /etc/vgpu-manager/driver/libvgpu-control.so > "$dir/etc/ld.so.preload"
      ;;
    nvshare)
      ln -s "$real_cuda" "$dir/lib/libcuda.so"
      ;;
    lupine)
      cp -a "$state"/layers/lupine/lib*.so* "$dir/lib/"
      ;;
  esac
fi
case $layer in  # daemons a node runs once, outside every pod
  nvshare)
    if [ ! -S /var/run/nvshare/scheduler.sock ]; then
      mkdir -p /var/run/nvshare
      setsid "$state/layers/nvshare/nvshare-scheduler" > "$state/nvshare-scheduler.log" 2>&1 < /dev/null &
      for _ in $(seq 50); do [ -S /var/run/nvshare/scheduler.sock ] && break; sleep 0.1; done
    fi
    ;;
  lupine)
    if ! (exec 3<> /dev/tcp/127.0.0.1/14833) 2> /dev/null; then
      setsid "$state/layers/lupine/lupine_driver_server" > "$state/lupine-server.log" 2>&1 < /dev/null &
      for _ in $(seq 100); do (exec 3<> /dev/tcp/127.0.0.1/14833) 2> /dev/null && break; sleep 0.1; done
    fi
    ;;
esac
if [[ $layer == vcuda-* ]]; then  # this call's quota, also in a pod a warm machine kept from an earlier call
  whole=0; [[ $pod == *+whole ]] && whole=$gpus
  VCUDA_WHOLE_GPUS=$whole "$state/layers/vcuda_config" "$dir/etc/vcuda" "${QUOTA:-8589934592}" > /dev/null
  if [[ $pod == *+noconfig ]]; then rm "$dir/etc/vcuda/vcuda.config"; fi
fi
added=()  # files the device plugin puts in place, SOURCE:TARGET
case $layer in
  vcuda-*) added+=("$state/layers/gpu-client:/usr/local/nvidia/bin/gpu-client") ;;
  hami) added+=("$state/layers/hami-core/libvgpu.so:/usr/local/vgpu/libvgpu.so") ;;
  hami-*) added+=("$state/layers/$layer/libvgpu.so:/usr/local/vgpu/libvgpu.so") ;;
  nvshare) added+=("$state/layers/nvshare/libnvshare.so:/usr/lib/nvshare/libnvshare.so") ;;
esac
vars=(PATH="$PATH" HOME=/root PYTHONUNBUFFERED=1 TMAGUARD_RECORD_DIR="${TMAGUARD_RECORD_DIR:-$state/records/$pod}")
[ -n "${PYTHONPATH:-}" ] && vars+=(PYTHONPATH="$PYTHONPATH")
case $layer in
  vcuda-*) vars+=(LD_LIBRARY_PATH="$dir/lib") ;;
  hami*)  # its device plugin sets a limit for each GPU it gives the pod (tensor parallel: every GPU here)
    for index in $(nvidia-smi --query-gpu=index --format=csv,noheader); do
      vars+=(CUDA_DEVICE_MEMORY_LIMIT_$index="${QUOTA_HAMI:-8g}")
    done
    vars+=(CUDA_DEVICE_SM_LIMIT=100 CUDA_DEVICE_MEMORY_SHARED_CACHE="$dir/hami-${QUOTA_HAMI:-8g}.cache") ;;
  vgpu-manager)  # it dlopens libcuda.so.<version> by that name: the container toolkit puts the driver's
    # files in a directory the loader searches (here they are elsewhere, found through ld.so.cache by SONAME)
    uuids=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n "$gpus" | paste -sd,)
    vars+=(LD_LIBRARY_PATH="$(dirname "$real_cuda")")
    # the container toolkit gives the pod only its GPUs' device nodes; on a machine of more GPUs,
    # CUDA_VISIBLE_DEVICES stands for that (vgpu-manager dies on a CUDA device it has no limit for)
    vars+=(CUDA_VISIBLE_DEVICES="$uuids" MANAGER_VISIBLE_DEVICES="$uuids" MANAGER_COMPATIBILITY_MODE=0)
    for ((index = 0; index < gpus; index++)); do
      vars+=(CUDA_MEM_LIMIT_$index="$(( ${QUOTA:-8589934592} >> 20 ))m" ${CORE_LIMIT:+CUDA_CORE_LIMIT_$index=$CORE_LIMIT})
    done ;;
  nvshare)
    vars+=(LD_PRELOAD=/usr/lib/nvshare/libnvshare.so LD_LIBRARY_PATH="$dir/lib") ;;
  lupine) vars+=(LD_LIBRARY_PATH="$dir/lib" LUPINE_SERVER=127.0.0.1:14833 LUPINE_DISABLE_LOCAL=1) ;;
esac
if [[ $layer == vcuda-* ]]; then
  python3 "$here/pids_daemon.py" "$dir/etc/vcuda/pids.config" $$ &
  trap "kill $! 2>/dev/null" EXIT
fi
if [ "${POD_SHM:-0}" = 1 ]; then  # made once outside the namespaces, so two calls for one pod share it
  mkdir -p "$dir/shm"
  mountpoint -q "$dir/shm" || mount -t tmpfs -o "size=${POD_SHM_SIZE:-16g},mode=1777" shm "$dir/shm"
  added+=("--bind:$dir/shm:/dev/shm")
fi
if [[ $pod == nvshare+nosocket ]]; then  # the scheduler's socket directory as a pod without it sees it
  mkdir -p "$dir/nosocket"
  added+=("--bind:$dir/nosocket:/var/run/nvshare")
fi
unshare -m --propagation private bash "$here/namespace.sh" "$dir" "$version" ${DRIVER_VERSION:+made-up-proc} \
  "${added[@]}" -- env -i "${vars[@]}" "${extra[@]}" "$@"
