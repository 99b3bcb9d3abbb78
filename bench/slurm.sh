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
{
    echo
    echo "Target: <= 1.1x what one node reads."
    echo
    echo "All nodes share one disk, one page cache and two cores here: after the first"
    echo "node, the shared directory and the copy are read from memory, and --sheaf's"
    echo "column is mostly N FUSE mounts decompressing and checking on two cores. On a"
    echo "real cluster each node reads the shared directory over the network; this"
    echo "table is the cost of the FUSE path, not a parallel filesystem's contention."
    echo "Not measured yet (issue 56): shared-storage bytes per job with a bcast mode"
    echo "(the plugin has only mode=lazy)."
} >> "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
log "wrote $OUT"
cat "$OUT"
