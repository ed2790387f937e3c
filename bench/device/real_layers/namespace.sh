#!/usr/bin/env bash
# Inside pod.sh's private mount namespace: each file the pod adds (SOURCE:TARGET) laid over the nearest
# existing directory above TARGET (an overlay; mounts below that directory, such as the driver's, are bound
# again on top), then the pod's /etc, then the command.
# usage: namespace.sh POD_DIR DRIVER_VERSION [made-up-proc] [SOURCE:TARGET | --bind:DIR:DIR ...] -- COMMAND ...
set -euo pipefail
dir=$1 version=$2; shift 2
made_up=0; [ "$1" = made-up-proc ] && { made_up=1; shift; }
n=0
while [ "$1" != "--" ]; do
  if [[ $1 == --bind:* ]]; then  # --bind:SOURCE:TARGET, a directory bound over another
    spec=${1#--bind:}; shift
    mkdir -p "${spec#*:}" && mount --bind "${spec%%:*}" "${spec#*:}"
    continue
  fi
  source=${1%%:*} target=${1#*:}; shift
  at=$(dirname "$target"); while [ ! -d "$at" ]; do at=$(dirname "$at"); done
  n=$((n + 1)); save=$dir/ns/save$n up=$dir/ns/up$n work=$dir/ns/work$n
  mkdir -p "$save" "$up/$(dirname "${target#"$at"}")" "$work"
  cp "$source" "$up/${target#"$at"}"
  mount --rbind "$at" "$save"
  below=$(awk -v at="$at/" 'index($5, at) == 1 {print $5}' /proc/self/mountinfo | sort -u)
  mount -t overlay overlay -o "lowerdir=$at,upperdir=$up,workdir=$work" "$at"
  for mounted in $below; do mount --rbind "$save${mounted#"$at"}" "$mounted"; done
done
shift  # --
# The pod's /etc last: its ld.so.preload (HAMi-core, vgpu-manager) names a file the overlays above put in
# place, and every program run before them (mount, cp) would try to preload it.
mount --bind "$dir/etc" /etc
if [ $made_up = 1 ]; then
  mount -t tmpfs none /proc/driver && mkdir -p /proc/driver/nvidia
  echo "NVRM version: NVIDIA UNIX x86_64 Kernel Module  $version  (made up)" > /proc/driver/nvidia/version
fi
exec "$@"
