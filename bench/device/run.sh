#!/usr/bin/env bash
# One device call (Hopper machine, no vLLM, no network): sets up vLLM 0.25.1 from .dev/, this package and a
# generated forwarding stand-in layer, then runs the overlay checks and the benchmarks. Results: $OUT.
# From the repository root: bash bench/device/run.sh [all|checks|encode|gemm]   (.dev/ and .whl/ prepared as docs/overlay-on-hopper.md says)
set -uo pipefail
stage=${1:-all}
wants() { [ "$stage" = all ] || [ "$stage" = "$1" ]; }
root=$(pwd)
out=/tmp/tmaguard-device-out  # bundled into $OUT/results.tgz at the end (few files come back)
rm -rf "$out" /tmp/rec-* /tmp/ov && mkdir -p "$out"
export PYTHONUNBUFFERED=1
step() { echo; echo "== $*"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"

step "environment: pyzmq and this package (builds the shims and overlays) into the image's Python"
py=$(python3 -c "import sys; print(sys.executable)")
$py -m pip install -q --no-index --no-deps --no-build-isolation .whl/*.whl "$root" || exit 1
mkdir -p /tmp/v25 && tar -xJf .dev/vllm-0.25.1-py.tar.xz -C /tmp/v25 &&
  xz -dc .dev/_C_stable_libtorch.abi3.so.xz > /tmp/v25/vllm/_C_stable_libtorch.abi3.so || exit 1
# vLLM's platform detection reads its own version from the distribution metadata.
mkdir -p /tmp/v25/vllm-0.25.1.dist-info && printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.25.1\n' \
  > /tmp/v25/vllm-0.25.1.dist-info/METADATA

step "the emulated pod: generated layer as libcuda.so.1, the real driver beside it"
real=$($py -c "import os; from vllm_tmaguard.stages.loader import resolve_library as r
print(os.path.realpath(r('libcuda.so.1', {}).path))")
pod=/tmp/pod
mkdir -p "$pod/lib" "$pod/root/etc/vcuda"
ln -sf "$real" "$pod/lib/$(basename "$real")"
$py bench/device/make_layer.py "$pod/lib/$(basename "$real")" "$pod/lib/libcuda.so.1" | tee "$out/layer.txt"
common=(PYTHONPATH=/tmp/v25:$root/bench/device)
in_pod=(LD_LIBRARY_PATH=$pod/lib TMAGUARD_ROOT=$pod/root)

if wants checks; then
step "checks: torch, Triton, Triton TMA, vLLM Machete"
check() {  # name, env...
  local name=$1; shift
  env "${common[@]}" TMAGUARD_RECORD_DIR=/tmp/rec-$name CHECK_MODE=$name "$@" \
    timeout 300 $py bench/device/overlay_check.py > "$out/check-$name.log" 2>&1
  grep '^RESULT ' "$out/check-$name.log" | tail -1 | cut -c8- | tee -a "$out/checks.jsonl"
  cp /tmp/rec-$name/last.json "$out/record-$name.json" 2>/dev/null || true
}
check bare
check layer-without-guard "${in_pod[@]}" TMAGUARD_MODE=off
check layer-shim-only "${in_pod[@]}" TMAGUARD_OVERLAY=off
check layer-overlay "${in_pod[@]}"
fi

if wants encode; then
step "encode: cuTensorMapEncodeTiled per call, direct / shim / overlay, interleaved"
gcc -O2 -o /tmp/encode_bench bench/device/encode_bench.c -ldl
shim=$($py -c "from vllm_tmaguard.stages.catalogue import shim_path; print(shim_path('encoders'))")
overlay=$($py -c "from vllm_tmaguard import overlay
print(overlay.install('$pod/lib/libcuda.so.1', '/tmp/ov'))")
for round in 1 2 3 4 5; do
  /tmp/encode_bench direct "$real" | tee -a "$out/encode.jsonl"
  env "${in_pod[@]}" /tmp/encode_bench shim "$real" "$shim" | tee -a "$out/encode.jsonl"
  env "${in_pod[@]}" /tmp/encode_bench overlay "$real" "$overlay" | tee -a "$out/encode.jsonl"
done
fi

if wants gemm; then
step "W4A16 GEMM: Machete / Marlin / cuBLAS bare, then Machete bare vs under the layer with the guard"
gemm() {  # name, args, env...
  local name=$1 args=$2; shift 2
  env "${common[@]}" TMAGUARD_RECORD_DIR=/tmp/rec-gemm "$@" timeout 400 $py bench/device/w4a16_gemm.py $args \
    > "$out/gemm-$name.log" 2>&1
  grep '^RESULT ' "$out/gemm-$name.log" | tail -1 | cut -c8- > "$out/gemm-$name.json"
  echo "$name: $(wc -c < "$out/gemm-$name.json") bytes"
}
[ "$stage" = all ] && gemm all-bare "--shapes all"
for round in 1 2; do
  gemm machete-bare-$round "--shapes all --kernels machete"
  gemm machete-layer-$round "--shapes all --kernels machete" "${in_pod[@]}"
done
fi
step "done"; ls -la "$out"
tar -czf "${OUT:-/tmp}/results.tgz" -C "$out" .
