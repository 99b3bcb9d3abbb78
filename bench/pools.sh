#!/usr/bin/env bash
# Software-pool broadcast benchmark (issue 13): one image to 2, 4 and 8
# simulated nodes (one rank each; every rank in its own mount + UTS namespace
# with its own host name and node-local directory, as in tests/bcast.rs), by
#   (a) every node copying the file itself (cp + fsync, all nodes at once),
#   (b) the sw-pool method (bench/swpool.c: striped read, one MPI_Bcast per
#       4 KiB block, all-zero blocks skipped),
#   (c) sheaf bcast;
# plus the repeat load (every node has it) and a v1 -> v2 delta. "Shared
# storage" is a file on this machine's disk; the page cache is dropped before
# every run so it is really read. Node-local disks are directories on one
# tmpfs (as on diskless nodes): N simulated nodes writing to this machine's
# one disk would measure that disk N times over, not the broadcast. Both MPI
# transports are run: shared memory (vader) and TCP over loopback (the
# latency of a kernel TCP stack, as on an Ethernet cluster).
# Writes bench/results/DATE-pools.md.
#
# Usage: bench/pools.sh            (root; after make build with MPI)
# Env:   SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench), NODES ("2 4 8"),
#        SIZE_MB (random pool size, default 1024), TRANSPORTS ("shm tcp"),
#        LOCAL (tmpfs | disk: node-local directories on the disk instead),
#        ROUNDS (default 3: every time is the median of ROUNDS runs)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
NODES=${NODES:-"2 4 8"}
SIZE_MB=${SIZE_MB:-1024}
TRANSPORTS=${TRANSPORTS:-"shm tcp"}
LOCAL=${LOCAL:-tmpfs}
ROUNDS=${ROUNDS:-3}
W=$DATA/pools
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-pools.md
log() { printf '[pools-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (namespaces, drop_caches)"
"$SHEAF" --version | grep -q "with MPI" || die "$SHEAF was built without MPI (make build with mpicc installed)"
command -v mpicc >/dev/null || die "mpicc missing (scripts/deps.sh installs it)"
mkdir -p "$W/shared" "$W/bin"
mpicc -O2 -o "$W/bin/swpool" "$ROOT/bench/swpool.c"

# The images: SIZE_MB of random data, and tree P (v1, and v2 = one package changed).
if [ ! -f "$W/shared/random-$SIZE_MB.sheaf" ]; then
  log "building the ${SIZE_MB} MiB random pool"
  rm -rf "$W/random" && mkdir -p "$W/random"
  head -c $((SIZE_MB << 20)) /dev/urandom > "$W/random/data.bin"
  "$SHEAF" build -q "$W/random" -o "$W/shared/random-$SIZE_MB.sheaf"
  rm -rf "$W/random"
fi
[ -d "$DATA/P" ] || die "$DATA/P missing: run bench/setup.sh P"
if [ ! -f "$W/shared/P-2.sheaf" ]; then
  log "building tree P, v1 and v2"
  "$SHEAF" build -q --force "$DATA/P" -o "$W/shared/P-1.sheaf"
  rm -rf "$W/P2" && cp -a "$DATA/P" "$W/P2"
  # v2: one package gets a new module and a changed file.
  pkg=$(find "$W/P2" -maxdepth 2 -name '__init__.py' | sort | sed -n 3p)
  head -c 200000 /dev/urandom | base64 > "$(dirname "$pkg")/_sheaf_bench_new.py"
  echo "# changed" >> "$pkg"
  "$SHEAF" build -q --force "$W/P2" -o "$W/shared/P-2.sheaf"
  rm -rf "$W/P2"
fi

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
BTL=self,vader
mpi() { # NODES CMD... : one rank per simulated node
  local n=$1; shift
  mpirun --allow-run-as-root --oversubscribe -np "$n" --mca btl "$BTL" \
    --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "$W/bin/node.sh" "$@"
}
# The node-local disks.
mkdir -p "$W/nodes"
if [ "$LOCAL" = tmpfs ]; then
  mountpoint -q "$W/nodes" || mount -t tmpfs -o size=$(( (SIZE_MB * 9 + 4096) ))m sheaf-bench-nodes "$W/nodes"
  trap 'umount "$W/nodes" 2>/dev/null || true' EXIT
fi
cat > "$W/bin/node.sh" <<EON
#!/bin/sh
n=\$OMPI_COMM_WORLD_RANK
exec unshare --mount --uts --propagation private sh -c "hostname simnode\$n && mount --bind $W/nodes/node\$n $W/local && exec \"\\\$@\"" sh "\$@"
EON
chmod +x "$W/bin/node.sh"
fresh_nodes() { rm -rf "$W"/nodes/node* "$W/local"; mkdir -p "$W/local"; for i in $(seq 0 $(($1 - 1))); do mkdir -p "$W/nodes/node$i"; done; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
json() { python3 -c "import json,sys; d=json.loads([l for l in sys.stdin.read().splitlines() if l.startswith('{')][0]); print(d['$1'])"; }

rows=(); cps=()
for img in random-$SIZE_MB P-1; do
  src=$W/shared/$img.sheaf
  size=$(stat -c %s "$src")
  v=()
  for r in $(seq "$ROUNDS"); do
    drop; t0=$(now); cp "$src" "$W/nodes/cp-one" && sync "$W/nodes/cp-one"; t1=$(now); rm -f "$W/nodes/cp-one"
    v+=("$(echo "$t1 - $t0" | bc)")
  done
  cp1=$(median "${v[@]}")
  log "$img: one local cp: ${cp1}s"
  cps+=("$img $cp1")
  for n in $NODES; do
    v=()
    for r in $(seq "$ROUNDS"); do
      fresh_nodes "$n"
      drop; t0=$(now)
      for i in $(seq 0 $((n - 1))); do (cp "$src" "$W/nodes/node$i/p.sheaf" && sync "$W/nodes/node$i/p.sheaf") & done; wait
      t1=$(now); v+=("$(echo "$t1 - $t0" | bc)")
    done
    ta=$(median "${v[@]}"); ra=$((size * n))
    for tr_name in $TRANSPORTS; do
      case $tr_name in shm) BTL=self,vader ;; tcp) BTL=self,tcp ;; *) die "TRANSPORTS: shm or tcp, not $tr_name" ;; esac
      vb=(); vc=(); vr=(); vs=()
      for r in $(seq "$ROUNDS"); do
        fresh_nodes "$n"
        drop; t0=$(now); rb=$(mpi "$n" "$W/bin/swpool" "$src" "$W/local/p.sheaf" | json bytes_read); t1=$(now)
        vb+=("$(echo "$t1 - $t0" | bc)")
        for i in $(seq 0 $((n - 1))); do cmp -s "$src" "$W/nodes/node$i/p.sheaf" || die "sw-pool: node $i copy differs"; done
        fresh_nodes "$n"
        drop; t0=$(now); rc=$(mpi "$n" "$SHEAF" bcast --json "$src" "$W/local/p.sheaf" | json bytes_read); t1=$(now)
        vc+=("$(echo "$t1 - $t0" | bc)")
        for i in $(seq 0 $((n - 1))); do cmp -s "$src" "$W/nodes/node$i/p.sheaf" || die "node $i copy differs"; done
        drop; t0=$(now); rj=$(mpi "$n" "$SHEAF" bcast --json "$src" "$W/local/p.sheaf" | grep '^{'); t1=$(now)
        vr+=("$(echo "$t1 - $t0" | bc)"); rr=$(echo "$rj" | json bytes_read); vs+=("$(echo "$rj" | json seconds)")
      done
      tb=$(median "${vb[@]}"); tc=$(median "${vc[@]}"); tr=$(median "${vr[@]}"); rs=$(median "${vs[@]}")
      log "$img to $n nodes over $tr_name: cp ${ta}s, sw-pool ${tb}s, sheaf ${tc}s, repeat ${tr}s"
      rows+=("| $img ($((size >> 20)) MiB) | $n | $tr_name | $ta | $tb | $tc | $(echo "scale=2; $tc / $cp1" | bc) | $(echo "scale=1; $tb / $tc" | bc) | $(echo "scale=2; $ra / $size" | bc) | $(echo "scale=4; $rb / $size" | bc) | $(echo "scale=4; $rc / $size" | bc) | $tr ($(printf %.3f "$rs")) | $rr |")
    done
  done
done

# Delta: nodes hold P-1, receive P-2 (shared memory).
BTL=self,vader
n=4; fresh_nodes $n
v=()
for r in $(seq "$ROUNDS"); do
  for i in $(seq 0 $((n - 1))); do rm -f "$W/nodes/node$i/p.sheaf"; cp "$W/shared/P-1.sheaf" "$W/nodes/node$i/p.sheaf"; done
  drop; t0=$(now); d=$(mpi $n "$SHEAF" bcast --json "$W/shared/P-2.sheaf" "$W/local/p.sheaf" | grep '^{'); t1=$(now)
  v+=("$(echo "$t1 - $t0" | bc)")
  for i in $(seq 0 $((n - 1))); do cmp -s "$W/shared/P-2.sheaf" "$W/nodes/node$i/p.sheaf" || die "delta: node $i copy differs"; done
done
td=$(median "${v[@]}")
dsent=$(echo "$d" | json bytes_sent); dread=$(echo "$d" | json bytes_read); dobj=$(echo "$d" | json objects_sent)
p2=$(stat -c %s "$W/shared/P-2.sheaf")
rm -rf "$W"/nodes/node* "$W/local"

{
  echo "# Pool broadcast, $(date -u +%Y-%m-%d\ %H:%M) UTC"
  echo
  echo "$(nproc) cores, $(uname -r), Open MPI $(mpirun --version | head -1 | awk '{print $NF}'); one rank per simulated node"
  echo "(own host name and node-local directory per rank); node-local directories on $LOCAL; transport"
  echo "shm = vader, tcp = TCP over loopback; shared storage = this machine's disk, page cache dropped"
  echo "before each run; all copies fsynced; every time the median of $ROUNDS runs."
  echo "cp = every node copies the file itself, all at once;"
  echo "sw-pool = bench/swpool.c (striped read, one broadcast per 4 KiB block); sheaf = sheaf bcast."
  echo "One local cp of each image (the anchor for the ≤ 2× target) is the 'vs 1 cp' denominator."
  echo "Times are wall clock around mpirun (its start-up, about 0.4 s here, included); the repeat column"
  echo "also gives the time sheaf bcast itself reports, from MPI start to the agreed end."
  echo
  echo "One local cp (s): ${cps[*]}"
  echo
  echo "| image | nodes | transport | cp s | sw-pool s | sheaf s | sheaf / 1 cp | sw-pool / sheaf | read ×image: cp | sw-pool | sheaf | repeat s, with mpirun (in bcast) | repeat bytes read |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Delta, 4 nodes holding P-1, receiving P-2 ($((p2 >> 20)) MiB; one package changed):"
  echo "$dobj objects, $dsent bytes sent ($(echo "scale=4; $dsent / $p2" | bc) of the image), $dread bytes read, ${td} s."
} > "$OUT"
log "wrote $OUT"
cat "$OUT"
