#!/bin/bash
# A/B of two ckptfs builds on a large Llama-shaped bf16 DCP checkpoint (8 gloo ranks): cold loads
# onto the GPU through each build's mount vs a physical copy, cold cat, 8 readers; logits compared;
# one load and one cat of each kind traced (e2e/bench/iotrace.py: the disks and the mount's CPU).
# Time-aware (LIMIT seconds). Run as root on a GPU host (BENCHMARKS.md, run R):
#   BINS=DIR PRESET=llama3-8b OUT=DIR bash e2e/bench/ab_large.sh     (DIR: ckptfs-base, ckptfs-new)
set -u
B=$(cd "$(dirname "$0")" && pwd)
G=${BINS:?BINS=DIR with ckptfs-base, ckptfs-new (and nullfs)}; H=${GPU_BENCH:-../shared/bench-gpu}; P=${PRESET:-llama3-8b}; W=/tmp/w-$P
LIMIT=${LIMIT:-470}; T0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=$OUT/ab.log
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el)s] $*" | tee -a "$L" >&2; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
dt() { python3 -c "print(round($(now)-$1,2))"; }
{ nproc; free -g | head -2; uname -r; nvidia-smi -L; cat /sys/block/*/queue/read_ahead_kb; df -h /tmp | tail -1
  python3 -c 'import torch,transformers;print("torch",torch.__version__,"transformers",transformers.__version__)'; } >> "$L" 2>&1
[ -e /dev/fuse ] || mknod /dev/fuse c 10 229
rm -rf "$W"; mkdir -p "$W"
t=$(now); timeout 300 python3 "$H/gen_dcp.py" "$W/ck" --preset "$P" --world 8 > "$OUT/gen.log" 2>&1; log "gen rc=$? $(dt $t) s"
CK=$W/ck/step_1; du -sh "$CK" >> "$L"
drop; t=$(now); "$G/ckptfs-new" export --quiet "$CK" "$W/copy" >> "$L" 2>&1; log "export rc=$? $(dt $t) s"
mnt() { mkdir -p "$W/m-$1"; "$G/ckptfs-$1" mount --log-file "$OUT/mount-$1.log" "$W/ck" "$W/m-$1" & MP=$!
  for i in $(seq 100); do [ -e "$W/m-$1/step_1/config.json" ] && break; sleep 0.1; done; }
umnt() { kill -TERM $MP; wait $MP 2>/dev/null; }
load() { # case dir
  local t=$(now); timeout 150 python3 "$H/load.py" hf "$2" "$W/l_$1_$(date +%s%N).pt" 2>>"$OUT/load.err" | tee -a "$OUT/loads.jsonl" | sed "s/^/LOAD $1 /" >> "$L"
  log "TIME load-$1 $(dt $t)"; }
catv() { local t=$(now); cat "$@" > /dev/null; echo "$(dt $t)"; }
par8() { python3 "$B/par_read.py" 8 "$@"; }
warm() { python3 -c 'import torch, transformers, safetensors; torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu")'; }
trace() { # case cmd...: one cold run under iotrace.py (the disks' reads in flight, sizes, gaps; the mount's CPU)
  local c=$1; shift
  python3 "$B/iotrace.py" --label "$c" ${MP:+--pid $MP} -- "$@" 2>>"$OUT/trace.err" | tee -a "$OUT/trace.jsonl" | sed "s/^/TRACE /" >> "$L"; }
r=0
while [ $r -lt 3 ]; do
  r=$((r+1)); [ $r -gt 1 ] && [ $(el) -gt $((LIMIT - 130)) ] && break
  if [ $((r % 2)) = 1 ]; then order="base new copy"; else order="copy new base"; fi
  for c in $order; do
    drop
    if [ $c = copy ]; then load copy "$W/copy"; else mnt $c; load $c "$W/m-$c/step_1"; umnt; fi
  done
  [ $r = 1 ] || continue
  for c in base new; do drop; mnt $c; log "TIME cat-view-$c $(catv $W/m-$c/step_1/*.safetensors)"; umnt; done
  drop; log "TIME cat-shards $(catv $CK/*.distcp)"
  for c in base new; do drop; mnt $c; log "TIME par8-view-$c $(par8 $W/m-$c/step_1/*.safetensors)"; umnt; done
  drop; log "TIME par8-copy $(par8 $W/copy/*.safetensors)"
  # Where the load's extra time goes: the same cold load from the copy and through the new build.
  [ $(el) -gt $((LIMIT - 200)) ] && continue
  # The libraries are read back after the drop, so that only the checkpoint is read cold.
  drop; warm; MP=; trace load-copy timeout 150 python3 "$H/load.py" hf "$W/copy" "$W/l_trace_copy.pt"
  drop; warm; mnt new; trace load-new timeout 150 python3 "$H/load.py" hf "$W/m-new/step_1" "$W/l_trace_new.pt"; umnt
  drop; MP=; trace cat-shards sh -c "cat $CK/*.distcp > /dev/null"
  drop; mnt new; trace cat-view-new sh -c "cat $W/m-new/step_1/*.safetensors > /dev/null"; umnt; MP=
done
if [ $(el) -lt $((LIMIT - 70)) ]; then # the byte path without a disk: shards in tmpfs
  mkdir -p /dev/shm/ck && cp -r "$CK" /dev/shm/ck/ && T=/dev/shm/ck/step_1
  log "TIME shm-cat-shards $(catv $T/*.distcp)"
  SZ=$(du -cb $T/*.distcp | tail -1 | cut -f1)
  for rr in 1 2; do
    for c in base new; do mkdir -p $W/s-$c; "$G/ckptfs-$c" mount --log-file "$OUT/shm-$c.log" /dev/shm/ck $W/s-$c & MP=$!
      for i in $(seq 100); do [ -e "$W/s-$c/step_1/config.json" ] && break; sleep 0.1; done
      log "TIME shm-cat-view-$c $(catv $W/s-$c/step_1/*.safetensors)"; umnt; done
    mkdir -p $W/nm; "$G/nullfs" -size $SZ $W/nm & MP=$!; sleep 0.5; log "TIME shm-nullfs $(catv $W/nm/data)"; umnt
    [ $(el) -gt $((LIMIT - 20)) ] && break
  done
  rm -rf /dev/shm/ck
fi
python3 - "$W" <<'PY' 2>&1 | tee -a "$L"
import glob, sys, torch
fs = sorted(glob.glob(f"{sys.argv[1]}/l_*.pt")); ref = torch.load(fs[0])
for f in fs:
    x = torch.load(f); print("LOGITS", f.split("/")[-1], "equal" if torch.equal(x, ref) else f"DIFF {(x-ref).abs().max()}")
PY
grep -h "TIME\|TRACE\|LOGITS\|rc=" "$L"
