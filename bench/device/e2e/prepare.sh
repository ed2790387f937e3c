#!/usr/bin/env bash
# Prepares, on a machine with network access, what the end-to-end run carries to the Hopper machine (which
# has torch 2.11.0+cu130, transformers and tokenizers, but no vLLM and no network). Writes two parts of at
# most ~60 MiB each (one device call carries at most 64 MiB):
#   .dev/e2e/part1: vLLM 0.25.1's Python tree and dist-info, its main extension, FlashAttention-3, the small
#                   extensions, and the serving dependencies the image lacks (cp312 wheels)
#   .dev/e2e/part2: FlashAttention-2 (pods that route away from FA3)
# Each extension is stripped, then every device-code payload a compute capability 9.0 GPU never loads is
# zeroed (trim_fatbin.py: entry headers stay, the driver picks the same sm_90/sm_90a cubin or PTX as from
# the original file), then xz-compressed. Left out: _moe_C_stable_libtorch (MoE only; vLLM 0.25.1 imports
# it with ImportError suppressed), third_party/deep_gemm and fmha_sm100 (FP8 / Blackwell), vllm-rs (the Rust
# front end, off by default).
# usage: bash bench/device/e2e/prepare.sh   (from the repository root; ~10 min, mostly xz)
set -euo pipefail
root=$(pwd)
work=${E2E_WORK:-/tmp/e2e-prepare}
out=$root/.dev/e2e
mkdir -p "$work" "$out/part1/so" "$out/part1/whl" "$out/part2/so"

wheel=$(ls "$work"/vllm-0.25.1-*.whl 2>/dev/null || true)
if [ -z "$wheel" ]; then
  python3 -m pip download -q --no-deps vllm==0.25.1 -d "$work"
  wheel=$(ls "$work"/vllm-0.25.1-*.whl)
fi
rm -rf "$work/tree" && mkdir -p "$work/tree" && (cd "$work/tree" && unzip -q "$wheel")

# The serving path's imports that the device image lacks (found by importing vLLM 0.25.1's API server,
# engine core, GPU worker and model runner, GPTQ, FlashAttention backend and `vllm bench serve` in a
# clean environment holding only the image's packages); vLLM 0.25.1's own pins where it has them.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_31_x86_64 -d "$out/part1/whl" \
  annotated-types==0.8.0 apache-tvm-ffi==0.1.15.post2 cachetools==8.0.1 cbor2==6.3.0 compressed-tensors==0.17.0 \
  fastapi==0.136.3 jiter==0.19.0 jmespath==1.1.0 llguidance==1.7.6 loguru==0.7.3 \
  model-hosting-container-standards==0.1.16 msgspec==0.22.0 openai==2.54.0 distro==1.9.0 openai-harmony==0.0.8 \
  opentelemetry-api==1.45.2 partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.3 \
  pydantic-core==2.50.4 python-multipart==0.0.34 prometheus-fastapi-instrumentator==8.1.0 pyzmq==27.3.0 setproctitle==1.3.8 sniffio==1.3.1 \
  starlette==1.10.0 typing-inspection==0.4.5 uvicorn==0.54.0 watchfiles==1.3.0 xgrammar==0.2.8

vllm=$work/tree/vllm
tar -C "$work/tree" -cJf "$out/part1/vllm-py.tar.xz" \
  --exclude='vllm/third_party/deep_gemm' --exclude='vllm/third_party/fmha_sm100' --exclude='vllm/vllm-rs' \
  --exclude='*.so' vllm vllm-0.25.1.dist-info

pack() {  # extension path (relative to vllm/), part
  local relative=$1 part=$2 name
  name=$(echo "$relative" | tr '/' '@')
  strip --strip-unneeded -o "$work/$name" "$vllm/$relative"
  python3 "$root/bench/device/e2e/trim_fatbin.py" "$work/$name" "$work/$name.trim"
  xz -9e -T2 -c "$work/$name.trim" > "$out/$part/so/$name.xz"
}
pack _C_stable_libtorch.abi3.so part1
pack vllm_flash_attn/_vllm_fa3_C.abi3.so part1
for small in _flashmla_C _flashmla_extension_C _qutlass_C _rust_tool_parser cumem_allocator fs_io_C spinloop; do
  strip --strip-unneeded -o "$work/$small.abi3.so" "$vllm/$small.abi3.so"
  xz -9e -c "$work/$small.abi3.so" > "$out/part1/so/$small.abi3.so.xz"
done
pack vllm_flash_attn/_vllm_fa2_C.abi3.so part2
du -sh "$out"/part*
