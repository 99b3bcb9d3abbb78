#!/usr/bin/env bash
# The Slurm plugin's cost (docs/slurm.md): on a real cluster of namespaced
# nodes (scripts/slurm-cluster.sh, NODES_MAX slurmd on this machine), the
# wall time of `srun -N N hostname` without and with `--sheaf` (a local
# image: the target is <= 1 s added), with `--sheaf-pool`, and the data phase
# of a job reading a dataset on every node: through `--sheaf` against
# reading the same files from the shared directory and against copying them
# to each node's local directory first; and the bytes an origin sends when
# the nodes read a published repository lazily through one squid.
#
#   bench/slurm.sh      (root; make build first)
#
# Environment: NODES ("4 8"), REPEAT (10 runs per cell, the median is
# reported), SIZE_MB (dataset size, 256), SLURM_OUT (the results file,
# default bench/results/DATE-slurm.md).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
SO=${SPANK_SO:-$(dirname "$SHEAF")/sheaf_spank.so}
NODES=${NODES:-"4 8"}
REPEAT=${REPEAT:-10}
SIZE_MB=${SIZE_MB:-256}
USER_NAME=sheaf-slurm-test
OUT=${SLURM_OUT:-$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-slurm.md}
log() { printf '[slurm %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (namespaces, slurmd)"
[ -x "$SHEAF" ] || die "$SHEAF missing: run make build"
[ -f "$SO" ] || die "$SO missing: make spank (needs libslurm-dev)"
max=0; for n in $NODES; do [ "$n" -gt "$max" ] && max=$n; done

id "$USER_NAME" >/dev/null 2>&1 || useradd --create-home --shell /bin/sh "$USER_NAME"
WORK=$(mktemp -d /tmp/sheaf-slurm-bench.XXXXXX)
chmod 755 "$WORK"
FUSE_MODE=$(stat -c %a /dev/fuse)
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
PYTHON=python3
cleanup() {
    [ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null
    stop_squid
    "$ROOT/scripts/slurm-cluster.sh" down "$WORK/cluster" || true
    umount "$WORK/lshared" 2>/dev/null || true
    chmod "$FUSE_MODE" /dev/fuse
    rm -rf "$WORK"
}
trap cleanup EXIT
chmod 666 /dev/fuse

# The dataset (files of 1-8 MiB of incompressible bytes), its image, a pool.
log "dataset: $SIZE_MB MiB"
mkdir -p "$WORK/shared/data" "$WORK/shared/pools/tools" "$WORK/out"
left=$SIZE_MB; i=0
while [ "$left" -gt 0 ]; do
    mb=$(( (i % 8) + 1 )); [ "$mb" -gt "$left" ] && mb=$left
    head -c $((mb << 20)) /dev/urandom > "$WORK/shared/data/f$i.bin"
    left=$((left - mb)); i=$((i + 1))
done
"$SHEAF" build "$WORK/shared/data" -o "$WORK/shared/data.sheaf" -q
"$SHEAF" pool init "$WORK/pool" >/dev/null 2>&1
"$SHEAF" pool build "$WORK/pool" -o "$WORK/shared/pools/tools/1.0.sheaf" --name tools/1.0 -q
chmod -R a+rX "$WORK/shared"
chown "$USER_NAME" "$WORK/out"

# Shared storage whose reads can be counted: an ext4 file system on a loop
# device (mounted before the nodes' namespaces are made, so they all see
# it); /sys/block/loopN/stat counts the sectors read from it.
truncate -s $((SIZE_MB * 2 + 128))M "$WORK/shared.ext4"
mkfs.ext4 -q -F "$WORK/shared.ext4"
mkdir -p "$WORK/lshared"
mount -o loop "$WORK/shared.ext4" "$WORK/lshared"
LOOPDEV=$(basename "$(findmnt -n -o SOURCE "$WORK/lshared")")
cp "$WORK/shared/data.sheaf" "$WORK/lshared/data.sheaf"
chmod 755 "$WORK/lshared"; chmod 644 "$WORK/lshared/data.sheaf"
PLUGSTACK="required $SO sheaf=$SHEAF pools=$WORK/shared/pools" \
    "$ROOT/scripts/slurm-cluster.sh" up "$WORK/cluster" "$max" >/dev/null
export SLURM_CONF=$WORK/cluster/etc/slurm.conf
as_user() { (cd "$WORK/out" && runuser -u "$USER_NAME" -- "$@"); }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }

# median of REPEAT wall times (s) of CMD...
time_median() {
    local i t0 t1 ts=()
    for i in $(seq "$REPEAT"); do
        t0=$(date +%s.%N)
        as_user "$@" >/dev/null 2>"$WORK/err" || die "$*: $(head -3 "$WORK/err")"
        t1=$(date +%s.%N)
        ts+=("$(echo "$t1 - $t0" | bc)")
    done
    printf '%s\n' "${ts[@]}" | sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.3f", m}'
}

sub() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a - b}'; }

# Data phase: every node reads every file once (cold page cache).
read_all='cat "$0"/* > /dev/null'
data_phase() {
    local n=$1 how=$2 t0 t1
    drop_caches
    t0=$(date +%s.%N)
    case $how in
        sheaf) as_user srun -N "$n" --sheaf="$WORK/shared/data.sheaf:/data" sh -c "$read_all" /data ;;
        shared) as_user srun -N "$n" sh -c "$read_all" "$WORK/shared/data" ;;
        copy) as_user srun -N "$n" sh -c 'd=$1/copy-$SLURM_JOB_ID; mkdir -p $d && cp -r "$0"/. $d && cat $d/* > /dev/null; rm -rf $d' \
                  "$WORK/shared/data" "$WORK/cluster/local" ;;
    esac >/dev/null 2>"$WORK/err" || die "data phase $how: $(head -3 "$WORK/err")"
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc | awk '{printf "%.2f", $1}'
}

{
    echo "# Slurm plugin: job start overhead and data phase"
    echo
    echo "bench/slurm.sh on $(date -u +%Y-%m-%d), $(nproc) cores, kernel $(uname -r), Slurm $(srun --version | awk '{print $2}'),"
    echo "sheaf $("$SHEAF" --version | awk '{print $2}'): $max namespaced slurmd on this one machine"
    echo "(scripts/slurm-cluster.sh: each node its own network, UTS and mount namespace on a"
    echo "bridge), the jobs run by an ordinary user with real srun; median of $REPEAT runs."
    echo "Image: a $SIZE_MB MiB dataset of incompressible files on the shared (local) disk;"
    echo "the plugin mounts it on every node (mode=lazy: each node reads the shared file)."
    echo
    echo "## Job start: srun -N N hostname"
    echo
    echo "| N | plain s | --sheaf s | added s | --sheaf + --sheaf-pool s | added s |"
    echo "|---|---|---|---|---|---|"
} > "$OUT.tmp"
for n in $NODES; do
    log "start overhead, N=$n"
    plain=$(time_median srun -N "$n" hostname)
    one=$(time_median srun -N "$n" --sheaf="$WORK/shared/data.sheaf:/data" hostname)
    both=$(time_median srun -N "$n" --sheaf="$WORK/shared/data.sheaf:/data" --sheaf-pool=tools/1.0 hostname)
    printf '| %s | %s | %s | %s | %s | %s |\n' "$n" "$plain" "$one" \
        "$(sub "$one" "$plain")" "$both" "$(sub "$both" "$plain")" >> "$OUT.tmp"
done
# The same with scope=job: the prolog mounts, the step joins.
printf 'required %s sheaf=%s pools=%s scope=job state_dir=%s\n' "$SO" "$SHEAF" "$WORK/shared/pools" \
    "$WORK/cluster/state" > "$WORK/cluster/etc/plugstack.conf"
{
    echo
    echo "With scope=job (each srun here is a job of its own: its prolog mounts, its step joins):"
    echo
    echo "| N | plain s | --sheaf s | added s |"
    echo "|---|---|---|---|"
} >> "$OUT.tmp"
for n in $NODES; do
    log "start overhead, scope=job, N=$n"
    plain=$(time_median srun -N "$n" hostname)
    one=$(time_median srun -N "$n" --sheaf="$WORK/shared/data.sheaf:/data" hostname)
    printf '| %s | %s | %s | %s |\n' "$n" "$plain" "$one" "$(sub "$one" "$plain")" >> "$OUT.tmp"
done
printf 'required %s sheaf=%s pools=%s\n' "$SO" "$SHEAF" "$WORK/shared/pools" > "$WORK/cluster/etc/plugstack.conf"
{
    echo
    echo "Target: <= 1 s added with a local image."
    echo
    echo "## Data phase: every node reads the whole dataset once (cold page cache)"
    echo
    echo "| N | --sheaf s | shared directory s | copy to node-local, then read s |"
    echo "|---|---|---|---|"
} >> "$OUT.tmp"
for n in $NODES; do
    log "data phase, N=$n"
    printf '| %s | %s | %s | %s |\n' "$n" "$(data_phase "$n" sheaf)" "$(data_phase "$n" shared)" \
        "$(data_phase "$n" copy)" >> "$OUT.tmp"
done
# Lazy through one squid: a published repository of the image on an origin
# (nginx on the host's loopback: the nodes reach it only through the proxy),
# one squid on the bridge, each node's cache cold; what the origin sends.
log "lazy through one squid"
WWW=$WORK/www
mkdir -p "$WWW"
"$SHEAF" publish "$WORK/shared/data.sheaf" "$WWW/repo" --name data >/dev/null
NGINX_ACCESS_LOG=$WORK/origin.log start_nginx
NET=${SLURM_NET:-10.78.0}
printf 'required %s sheaf=%s proxy=http://%s.254:13128 cache_dir=%s\n' "$SO" "$SHEAF" "$NET" \
    "$WORK/cluster/local/sheaf-cache-%u" > "$WORK/cluster/etc/plugstack.conf"
{
    echo
    echo "## Lazy through one squid: bytes the origin sends"
    echo
    echo "A published repository of the image (mode=lazy, plugstack proxy=), its origin"
    echo "reachable from the nodes only through one squid on the bridge; squid and every"
    echo "node's cache (cache_dir=, node-local) cold; every node reads the whole dataset."
    echo
    echo "| N | origin bytes | x one node | image bytes |"
    echo "|---|---|---|---|"
} >> "$OUT.tmp"
one=""
for n in 1 $NODES; do
    start_squid_on "$NET.254:13128" "$WORK/squid"
    rm -rf "$WORK"/cluster/nodes/*/local/sheaf-cache-*
    : > "$WORK/origin.log"
    as_user srun -N "$n" --sheaf="$BASE/repo/data:/data" sh -c "$read_all" /data >/dev/null 2>"$WORK/err" ||
        die "lazy, N=$n: $(head -3 "$WORK/err")"
    stop_squid
    bytes=$(awk '{s+=$1} END {print s+0}' "$WORK/origin.log")
    [ -n "$one" ] || one=$bytes
    printf '| %s | %s | %s | %s |\n' "$n" "$bytes" "$(awk -v a="$bytes" -v b="$one" 'BEGIN {printf "%.3f", a / b}')" \
        "$(stat -c %s "$WORK/shared/data.sheaf")" >> "$OUT.tmp"
done
echo -e "\nTarget: <= 1.1x what one node reads." >> "$OUT.tmp"
# mode=bcast: the step's first node reads the image on shared storage once
# and sbcast sends it to the others; bytes read from the loop device (cold
# page cache), and the job's wall time against mode=lazy's.
log "mode=bcast"
IMG_BYTES=$(stat -c %s "$WORK/lshared/data.sheaf")
dev_read() { awk '{printf "%.0f", $3 * 512}' "/sys/block/$LOOPDEV/stat"; }
bcast_job() {
    local n=$1 mode=$2 b0 b1 t0 t1
    printf 'required %s sheaf=%s mode=%s bcast_dir=%s\n' "$SO" "$SHEAF" "$mode" \
        "$WORK/cluster/local/sheaf-bcast" > "$WORK/cluster/etc/plugstack.conf"
    drop_caches
    b0=$(dev_read)
    t0=$(date +%s.%N)
    as_user srun -N "$n" --sheaf="$WORK/lshared/data.sheaf:/data" sh -c "$read_all" /data >/dev/null 2>"$WORK/err" ||
        die "$mode, N=$n: $(head -3 "$WORK/err")"
    t1=$(date +%s.%N)
    b1=$(dev_read)
    echo "$((b1 - b0)) $(echo "$t1 - $t0" | bc | awk '{printf "%.2f", $1}')"
}
{
    echo
    echo "## mode=bcast: shared-storage bytes per job"
    echo
    echo "The image ($IMG_BYTES bytes) on an ext4 file system on a loop device, the"
    echo "shared storage; bytes read from that device by the whole job (page cache dropped"
    echo "before it), every node reading the whole dataset. mode=bcast: the step's first node"
    echo "reads, sbcast sends to each node's bcast_dir, every node mounts its copy. mode=lazy"
    echo "for comparison: here the nodes share one page cache, so the device is read about"
    echo "once whatever N; on a cluster each node reads what it reads, N x the one-node"
    echo "figure (the last column, computed, not measured)."
    echo
    echo "| N | bcast bytes | x image | bcast job s | lazy job s | lazy bytes, 1 node | lazy on a cluster (N x 1 node) |"
    echo "|---|---|---|---|---|---|---|"
} >> "$OUT.tmp"
read -r lazy1 _ <<<"$(bcast_job 1 lazy)"
for n in $NODES; do
    read -r bb bt <<<"$(bcast_job "$n" bcast)"
    read -r _ lt <<<"$(bcast_job "$n" lazy)"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$n" "$bb" \
        "$(awk -v a="$bb" -v b="$IMG_BYTES" 'BEGIN {printf "%.3f", a / b}')" "$bt" "$lt" "$lazy1" \
        "$(awk -v a="$lazy1" -v b="$IMG_BYTES" -v n="$n" 'BEGIN {printf "%.2fx", n * a / b}')" >> "$OUT.tmp"
done
left=$(find "$WORK"/cluster/nodes/*/local/sheaf-bcast -mindepth 1 2>/dev/null | wc -l)
{
    echo
    echo "Target: 1.0x the image with bcast. Copies left in the nodes' bcast_dir after the jobs: $left."
    echo "The bcast job's time includes sbcast writing N copies of the image to this one"
    echo "machine's disk and N mounts on two cores; on a cluster the nodes write their"
    echo "copies in parallel, each to its own disk, down slurmd's tree."
} >> "$OUT.tmp"
{
    echo
    echo "All nodes share one disk, one page cache and two cores here: after the first"
    echo "node, the shared directory and the copy are read from memory, and --sheaf's"
    echo "column is mostly N FUSE mounts decompressing and checking on two cores. On a"
    echo "real cluster each node reads the shared directory over the network; this"
    echo "table is the cost of the FUSE path, not a parallel filesystem's contention."
} >> "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
log "wrote $OUT"
cat "$OUT"
