#!/bin/bash
# Cold loads (load.py hf DIR) of one checkpoint, interleaved: from a copy, and through a fresh
# mount for each set of mount flags given; each traced by iotrace.py (the disks' reads, the
# mount's CPU), with the view bytes the kernel asked for (.ckptfs bytes_served). Root.
#   SRC=DIR VIEW=step_1 COPY=DIR ROUNDS=3 bash e2e/bench/load_ab.sh "" "--read-ahead 8MiB"
# (SRC is mounted; VIEW is the checkpoint's path under it; "" is the defaults.) BENCHMARKS.md, run T.
set -u
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/../.." && pwd)
H=${GPU_BENCH:-$R/../shared/bench-gpu}; BIN=${BIN:-$R/bin/ckptfs}; M=${MNT:-/tmp/load-ab-mnt}
drop() { sync; echo 3 > /proc/sys/vm/drop_caches
  # The libraries are read back, so that only the checkpoint is read cold.
  python3 -c 'import torch, transformers, safetensors'; }
load() { # label dir [pid]
  python3 "$B/iotrace.py" --label "$1" ${3:+--pid $3} -- python3 "$H/load.py" hf "$2" /tmp/load-ab.pt 2>/tmp/load-ab.err
  tail -1 /tmp/load-ab.err; }
for r in $(seq "${ROUNDS:-3}"); do
  drop; load copy "$COPY"
  for flags in "$@"; do
    drop; mkdir -p "$M"; "$BIN" mount $flags --log-file /tmp/load-ab-mount.log "$SRC" "$M" & MP=$!
    for i in $(seq 100); do [ -e "$M/$VIEW/config.json" ] && break; sleep 0.1; done
    load "mount $flags" "$M/$VIEW" $MP
    python3 -c "import json,sys; print(json.dumps({'bytes_served': json.load(open(sys.argv[1]))['bytes_served']}))" "$M/.ckptfs"
    kill $MP; wait $MP
  done
done
