#!/usr/bin/env bash
# One device call: where HAMi-core loses the CUDA 13 runtime (its limit is not kept on the H100 even with the
# guard off, docs/real-layers.md). In the HAMi pod, guard off: what libvgpu.so exports of the driver's look-up
# functions; what HAMi's dlsym hands out for them (dladdr of the pointer); then torch's first allocation with
# the dynamic loader's trace of every binding (LD_DEBUG=bindings, which includes what dlsym and dlvsym resolve
# at run time; filtered as it is written) and HAMi's log at its most verbose. Results: $OUT/hami-trace.tgz.
# usage: bash bench/device/real_layers/hami_trace.sh   (repository root; carry .dev/e2e/part1 .thirdparty)
set -uo pipefail
here=bench/device/real_layers
out=/tmp/hami-trace && rm -rf "$out" && mkdir -p "$out"
bash bench/device/e2e/setup.sh > "$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 1; }
bash $here/build.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
export PYTHONPATH=/tmp/e2e/site:/tmp/e2e/v25:$(pwd)/bench/device
state=${STATE:-/tmp/rl}

echo "== libvgpu.so's exports of the look-up functions"
nm -D --defined-only "$state/layers/hami-core/libvgpu.so" | grep -E " (cuGetProcAddress|cuGetExportTable|dlsym|dlvsym)" || echo none

echo "== what HAMi's dlsym hands out for them, on libcuda.so.1's handle"
probe='import ctypes, os
class Info(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
libc = ctypes.CDLL(None)
libc.dlsym.restype = ctypes.c_void_p
libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
cuda = ctypes.CDLL("libcuda.so.1")
for name in ("cuGetProcAddress_v2", "cuGetProcAddress", "cuMemAlloc_v2", "cuGetExportTable"):
    pointer, info = libc.dlsym(cuda._handle, name.encode()), Info()
    where = libc.dladdr(ctypes.c_void_p(pointer), ctypes.byref(info)) and info.fname.decode()
    print(name, "->", where, (info.sname or b"?").decode() if pointer else None)'
timeout 60 bash $here/pod.sh hami TMAGUARD_MODE=off -- python3 -c "$probe" 2>&1 | grep -- "->"

echo "== torch's first allocation, guard off, traced"
timeout 240 bash $here/pod.sh hami TMAGUARD_MODE=off LIBCUDA_LOG_LEVEL=4 LD_DEBUG=bindings -- \
  python3 $here/check.py quota > "$out/quota.log" \
  2> >(grep -E "libcudart|libvgpu|cuGetProcAddress|cuGetExportTable|HAMI-core" > "$out/bindings.log")
sleep 2
echo "quota: $(grep '^RESULT' "$out/quota.log" | cut -c8-160)"
echo "-- cudart's own look-ups (dlsym, dlvsym, dlopen) and what answered"
grep -E "file [^ ]*libcudart.so.13 .* to .*symbol \`(dlsym|dlvsym|dlopen|dlmopen|dlinfo|dladdr)'" "$out/bindings.log" |
  sed -E 's/^ *[0-9]+: *//' | sort | uniq -c
echo "-- bindings of the look-up functions and the allocation entry points"
grep -E "symbol \`(cuGetProcAddress|cuGetProcAddress_v2|cuGetExportTable|cuMemAlloc_v2|cuMemGetInfo_v2)'" "$out/bindings.log" |
  sed -E 's/^ *[0-9]+: *//' | sort | uniq -c | head -30
echo "-- HAMi's hooks that ran"
grep -h -o -E "into (_?cuGetProcAddress(_v2)?|cuMemAlloc_v2|cuMemGetInfo_v2|dlsym cuGetProcAddress[_v2]*)[^:]*" \
  "$out/bindings.log" "$out/quota.log" | sort | uniq -c
cd /tmp && tar -czf "${OUT:-/tmp}/hami-trace.tgz" hami-trace/quota.log hami-trace/bindings.log
echo "results: $(du -sh "${OUT:-/tmp}/hami-trace.tgz" | cut -f1)"
