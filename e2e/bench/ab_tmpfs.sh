#!/bin/bash
# A/B of two ckptfs builds with no disk: Llama-shaped bf16 DCP checkpoints from 8 gloo ranks in
# /dev/shm (HF names, and torchtitan names whose view RoPE-permutes q/k); cold cat of the views
# through both builds, of the same bytes unmapped, through a null go-fuse server; 8 readers.
#   BINS=DIR PRESET=llama3-3b OUT=DIR bash e2e/bench/ab_tmpfs.sh   (DIR: ckptfs-base, ckptfs-new, and nullfs from (cd e2e/bench && go build ./nullfs))
set -u
B=$(cd "$(dirname "$0")" && pwd)
G=${BINS:?BINS=DIR with ckptfs-base, ckptfs-new and nullfs}; H=${GPU_BENCH:-../shared/bench-gpu}; R=$(cd "$(dirname "$0")/../.." && pwd); P=${PRESET:-llama3-3b}
LIMIT=${LIMIT:-300}; T0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=$OUT/shm.log
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el)s] $*" | tee -a "$L" >&2; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
dt() { python3 -c "print(round($(now)-$1,2))"; }
[ -e /dev/fuse ] || mknod /dev/fuse c 10 229
S=/dev/shm/b; rm -rf $S; mkdir -p $S/hf $S/tt
t=$(now); timeout 150 python3 "$H/gen_dcp.py" $S/hf --preset $P --world 8 > "$OUT/gen-hf.log" 2>&1; log "gen-hf rc=$? $(dt $t)"
t=$(now); (cd $R && timeout 150 python3 e2e/bench/gen_llama.py $S/tt/step_1 --preset $P --world 8 --names torchtitan) > "$OUT/gen-tt.log" 2>&1; log "gen-tt rc=$? $(dt $t)"
W=/tmp/shmw; mkdir -p $W
cpu() { awk '{print $14+$15}' /proc/$1/stat 2>/dev/null || echo 0; }
mnt() { # build src flags...
  mkdir -p $W/m; "$G/ckptfs-$1" mount --log-file "$OUT/m-$1.log" "${@:3}" "$2" $W/m & MP=$!
  for i in $(seq 100); do [ -e "$W/m/step_1/config.json" ] && break; sleep 0.1; done; }
umnt() { kill -TERM $MP; wait $MP 2>/dev/null; }
rd() { # name files...
  local c0=$(cpu $MP) t=$(now); cat "${@:2}" > /dev/null; local s=$(dt $t) c1=$(cpu $MP)
  log "TIME $1 $s cpu $(python3 -c "print(round(($c1-$c0)/100,2))")"; }
par8() { log "TIME $1 $(python3 "$B/par_read.py" 8 "${@:2}")"; }
SZ=0
mnt new $S/hf; du -cb $W/m/step_1/*.safetensors | tail -1 >> "$L"; SZ=$(du -cb $W/m/step_1/*.safetensors | tail -1 | cut -f1); umnt
rd shards $S/hf/step_1/*.distcp
for r in 1 2 3; do
  [ $(el) -gt $((LIMIT - 40)) ] && break
  for b in base new; do drop; mnt $b $S/hf; rd view-$b $W/m/step_1/*.safetensors; umnt; done
  drop; mkdir -p $W/n; "$G/nullfs" -size $SZ $W/n & MP=$!; sleep 0.5; rd nullfs $W/n/data; umnt
  for b in base new; do drop; mnt $b $S/tt; rd rope-$b $W/m/step_1/*.safetensors; umnt; done
  drop; mnt new $S/tt --map none; rd rope-unmapped-new $W/m/step_1/*.safetensors; umnt
  [ $r = 1 ] || continue
  for b in base new; do drop; mnt $b $S/hf; par8 par8-view-$b $W/m/step_1/*.safetensors; umnt; done
  drop; "$G/nullfs" -size $SZ $W/n & MP=$!; sleep 0.5; par8 par8-nullfs $W/n/data; umnt
done
rm -rf $S
grep -h "TIME\|rc=" "$L"
