#!/usr/bin/env bash
# Inside pod.sh's private mount namespace: the pod's /etc, and /usr/local with the pod's additions over it
# (an overlay; mounts below /usr/local, such as the driver's, are bound again on top), then the command.
# usage: namespace.sh POD_DIR DRIVER_VERSION [made-up-proc] -- COMMAND ...
set -euo pipefail
dir=$1 version=$2; shift 2
made_up=0; [ "$1" = made-up-proc ] && { made_up=1; shift; }
shift  # --
mount --bind "$dir/etc" /etc
if [ -n "$(ls -A "$dir/up/usr-local")" ]; then
  mkdir -p "$dir/save"
  mount --rbind /usr/local "$dir/save"
  below=$(awk '$5 ~ "^/usr/local/" {print $5}' /proc/self/mountinfo | sort -u)
  mount -t overlay overlay -o "lowerdir=/usr/local,upperdir=$dir/up/usr-local,workdir=$dir/work" /usr/local
  for target in $below; do mount --rbind "$dir/save${target#/usr/local}" "$target"; done
fi
if [ $made_up = 1 ]; then
  mount -t tmpfs none /proc/driver && mkdir -p /proc/driver/nvidia
  echo "NVRM version: NVIDIA UNIX x86_64 Kernel Module  $version  (made up)" > /proc/driver/nvidia/version
fi
exec "$@"
