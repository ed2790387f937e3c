#!/usr/bin/env bash
# Device calls on a 2-GPU Hopper machine (issue 33): vLLM across two "nodes" on one machine, each node its own
# emulated pod (pod.sh: its own mount namespace, its own /dev/shm, its own GPU through CUDA_VISIBLE_DEVICES,
# its own record directory) under HAMi-core at Volcano v1.12.0's pin with an 8 GiB limit, the guard installed
# and nothing else set; vLLM 0.25.1 and the e2e model:
#   mp:  `vllm serve --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --tensor-parallel-size 2` in node 0,
#        the same with `--node-rank 1 --headless` in node 1 (vLLM's multi-node without Ray);
#   ray: `ray start --head` in node 0, `ray start --address` in node 1, then `vllm serve
#        --distributed-executor-backend ray --tensor-parallel-size 2` in node 0 (vLLM's Ray executor: its
#        workers are actors the raylets start, with their pods' environments; each pod's /dev/shm its own:
#        vLLM's custom all-reduce counts ranks that see one shared-memory segment as one node, and on a
#        shared /dev/shm it took the two pods for one node and asked node 0 for a second GPU);
# then the prompts, and every Python process probed (E2E_PROBE: what cudaMemGetInfo shows it, and whether
# 10 GiB past its limit is refused). Plus issue 32 item 3: HAMi-core's pod with the preloaded file gone.
# usage: STAGE=ray bash bench/device/real_layers/multinode.sh   (a first call, carrying .dev/ray: unpacks Ray
#          into /tmp/ray-site on the warm machine; the tarball is made by the command in its header below)
#        bash bench/device/real_layers/multinode.sh [mp] [ray]   (carry .dev/e2e/part1 .dev/thirdparty.tar.xz;
#          GONE=0: without issue 32's step; READY_S: how long the server may take, default 300)
# .dev/ray/ray.tar.xz: Ray 2.60.0's cp312 wheel unpacked, without its jars, dashboard client, rllib, tune,
#   train and data (`pip download --no-deps ray==2.60.0 ...; unzip; rm -r ...; tar -cJ`), and its pure
#   dependencies' wheels in .dev/ray/whl.
set -uo pipefail
export PYTHONUNBUFFERED=1
here=bench/device/real_layers
state=${STATE:-/tmp/rl}
if [ "${STAGE:-}" = ray ]; then
  rm -rf /tmp/ray-site && mkdir -p /tmp/ray-site && tar -xJf .dev/ray/ray.tar.xz -C /tmp/ray-site
  [ -d .dev/ray/whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ray-site .dev/ray/whl/*.whl
  PYTHONPATH=/tmp/ray-site python3 -c "import ray; print('ray', ray.__version__)"
  exit
fi
modes=("$@"); [ ${#modes[@]} -gt 0 ] || modes=(mp ray)
out=${OUT:-$state/multinode} && mkdir -p "$out"  # logs straight into $OUT: they come back even if the call is cut
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
bash bench/device/e2e/setup.sh > "$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 1; }
LAYERS="hami-8c32de6" bash $here/build.sh > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
site=/tmp/e2e/site:/tmp/e2e/v25:$(pwd)/bench/device/e2e/probe
[ -d /tmp/ray-site ] && site=$site:/tmp/ray-site
export PYTHONPATH=$site:$(pwd)/bench/device

if [ "${GONE:-1}" = 1 ]; then  # GONE=0: not again
  echo "$(date +%T) == issue 32 item 3: HAMi-core's preload names a file that is gone"
  gone=$state/pods/hami-8c32de6+gone
  bash $here/pod.sh hami-8c32de6+gone -- true > /dev/null 2>&1  # lays the pod out
  echo /usr/local/vgpu/gone/libvgpu.so > "$gone/etc/ld.so.preload"
  timeout 120 bash $here/pod.sh hami-8c32de6+gone TMAGUARD_RECORD_DIR=$out/gone -- \
    python3 $here/check.py quota --vllm > "$out/gone.log" 2>&1
  grep -hE "tmaguard pid|cannot be preloaded|^RESULT" "$out/gone.log" | cut -c1-500
fi

model=/tmp/e2e/model
node() {  # N NAME=VALUE... -- COMMAND...: node N's pod (its GPU, its records, the probe)
  local n=$1; shift
  mkdir -p "$state/node$n/probe"
  POD_SHM=1 bash $here/pod.sh "hami-8c32de6+n$n" CUDA_VISIBLE_DEVICES=$n NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 TMAGUARD_RECORD_DIR=$out/node$n/records \
    E2E_PROBE_DIR=$state/node$n/probe HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 \
    VLLM_CACHE_ROOT=/tmp/e2e/cache "$@"
}
ready() {  # PORT SECONDS PID: answers /health, or gives up once the server's process is gone
  for _ in $(seq "$2"); do
    curl -sf "http://127.0.0.1:$1/health" > /dev/null && return 0
    kill -0 "$3" 2> /dev/null || return 1
    sleep 1
  done
  return 1
}
probe_all() {  # every noted process answers (SIGWINCH), then its result is printed
  for note in "$state"/node*/probe/pid-*; do kill -WINCH "${note##*pid-}" 2> /dev/null; done
  sleep 15
  for result in "$state"/node*/probe/result-*.json; do
    [ -f "$result" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1]))
if r.get('cuda'): print('PROBE', sys.argv[1].split('/')[-3], r['pid'], r.get('title'), 'total %.2f GiB' % (r['total']/2**30), '10 GiB more:', r.get('past_limit'))" "$result"
  done
}
ask() {  # PORT
  curl -s "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$model\", \"prompt\": \"The capital of France is\", \"max_tokens\": 16, \"temperature\": 0}" | cut -c1-300
  echo
}
records() {
  for n in 0 1; do
    for r in "$out/node$n/records"/process-*.json; do
      [ -f "$r" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1]))
print('RECORD node$n', r['pid'], r['trigger'][:40], '|', r['summary'][:90], '|', [a['kind'] for a in r['actions']], r.get('replayed_from'))" "$r"
    done
  done
}
stop_all() { pkill -f "vllm.entrypoints" ; pkill -f "ray::" ; sleep 3; pkill -9 -f "vllm.entrypoints"; PYTHONPATH=$site python3 -c "import sys; from ray.scripts.scripts import main; sys.exit(main())" stop --force > /dev/null 2>&1; sleep 2; }
serve=(python3 -m vllm.entrypoints.cli.main serve "$model" --tensor-parallel-size 2 --port 8300 --seed 0)
for mode in "${modes[@]}"; do
  echo "$(date +%T) == $mode"
  rm -rf "$state"/node*/probe "$out"/node*/records
  if [ "$mode" = mp ]; then
    node 0 -- "${serve[@]}" --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 > "$out/mp-node0.log" 2>&1 &
    server=$!
    node 1 -- "${serve[@]}" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --headless > "$out/mp-node1.log" 2>&1 &
  else
    ray=(python3 -c "import sys; from ray.scripts.scripts import main; sys.exit(main())" start --disable-usage-stats)
    node 0 -- "${ray[@]}" --include-dashboard=false --head --port 6390 --num-gpus 1 --block > "$out/ray-head.log" 2>&1 &
    sleep 12
    node 1 -- "${ray[@]}" --address 127.0.0.1:6390 --num-gpus 1 --block > "$out/ray-worker.log" 2>&1 &
    sleep 12
    node 0 RAY_ADDRESS=127.0.0.1:6390 -- "${serve[@]}" --distributed-executor-backend ray > "$out/ray-serve.log" 2>&1 &
    server=$!
  fi
  if ready 8300 "${READY_S:-300}" "$server"; then echo "$mode: ready"; ask 8300; probe_all; else
    echo "$mode: not ready"
    [ "$mode" = ray ] && tar -czhf "$out/ray-logs.tgz" -C /tmp/ray/session_latest logs 2> /dev/null
  fi
  records
  grep -hE "tmaguard pid" "$out"/${mode}*.log | cut -c1-260 | head -12
  grep -hE "Error|error" "$out"/${mode}*.log | grep -v "tmaguard" | head -8 | cut -c1-300
  stop_all
  tar -czf "$out/$mode-records.tgz" -C "$out" node0 node1 2>/dev/null
done
