#!/usr/bin/env bash
# A simulated cluster on this machine (issue 41, part 2; first part: the lazy
# fan-out). N "nodes", each a network namespace with its own node cache and
# mount point, joined by veth pairs to a bridge namespace; the origin (nginx,
# serving tree P as a published repository) and one squid each in their own
# namespace. tc netem on every node's link adds DELAY per hop and a RATE limit.
# All N nodes mount the image through squid and run a cold
# `import numpy, scipy.linalg, pandas` at once. Measured: bytes the origin
# sent (nginx's access log, $body_bytes_sent), against one node's; wall time
# of the slowest node, against N=1. Writes bench/results/DATE-cluster.md.
#
# Second part: the broadcast. `sheaf bcast` of a random pool (SIZE_MB) and of
# tree P's image to N namespaced nodes over MPI TCP on the bridge (mpirun in
# the host namespace, one rank per node, each rank in its node's network,
# mount and UTS namespaces with its own host name and node-local directory),
# against the sw-pool method (bench/swpool.c) on the same namespaces, at each
# per-node rate of BRATES. Measured: wall time around mpirun, bytes each tool
# read from shared storage (this machine's disk, page cache dropped), and
# every node's copy compared with the source.
#
# Usage: bench/cluster.sh            (root; after bench/setup.sh P; make build
#                                     with MPI for the broadcast part)
# Env:   PARTS="fanout bcast"  NODES="1 4 8 16"  DELAYS="0 50us 200us"
#        RATE=1gbit  BNODES="4 8 16"  BRATES="1gbit 10gbit"  SIZE_MB=1024
#        BIMAGES="random P"  SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench),
#        PYTHON (python3), CLUSTER_OUT (the results file)
# Every namespace, mount and process it makes is removed at the end.
# Not here: mpifileutils dbcast (its sources are not reachable from a script
# on this machine; anchors.md has its loopback figure).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
PYTHON=${PYTHON:-python3}
PARTS=${PARTS:-"fanout bcast"}
NODES=${NODES:-"1 4 8 16"}
BNODES=${BNODES:-"4 8 16"}
BRATES=${BRATES:-"1gbit 10gbit"}
SIZE_MB=${SIZE_MB:-1024}
BIMAGES=${BIMAGES:-"random P"}
DELAYS=${DELAYS:-"0 50us 200us"}
RATE=${RATE:-1gbit}
IMPORT="import numpy, scipy.linalg, pandas"
NET=10.77.0
OUT=${CLUSTER_OUT:-$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-cluster.md}

log() { printf '[cluster %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (namespaces, tc, drop_caches)"
[ -x "$SHEAF" ] || die "$SHEAF missing: run make build"
[ -d "$DATA/P" ] || die "$DATA/P missing: run bench/setup.sh P"
command -v nginx >/dev/null || die "nginx missing"
command -v squid >/dev/null || die "squid missing"

WORK=$(mktemp -d "$DATA/cluster.XXXXXX")
NSES=()
cleanup() {
    local ns m
    ip link del sc-host 2>/dev/null || true
    for m in $(grep -o " $WORK/[^ ]*/mnt " /proc/mounts || true); do
        "$SHEAF" umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    for ns in "${NSES[@]}"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
    done
    sleep 0.5
    for ns in "${NSES[@]}"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

# --- the network --------------------------------------------------------------------
source "$ROOT/scripts/netns.sh"
BR=sc-br
NSES+=($BR); netns_bridge $BR
# attach NS HOSTNUM [QDISC]: NS gets eth0 = NET.HOSTNUM/24 on the bridge.
attach() {
    local ns=$1 n=$2 qdisc=${3:-}
    ip netns add "$ns"; NSES+=("$ns")
    netns_attach $BR "$ns" "$NET.$n/24" "b$n" "e$n"
    if [ -n "$qdisc" ]; then ip netns exec "$ns" tc qdisc add dev eth0 root $qdisc; fi
}
attach sc-origin 1
attach sc-proxy 2
# netem (delay) where the kernel has it; else tbf, the rate limit alone (this
# machine's 6.18 kernel has no sch_netem module: delays are not simulated).
if ip netns exec sc-origin tc qdisc add dev lo root netem delay 1us 2>/dev/null; then
    ip netns exec sc-origin tc qdisc del dev lo root
    HAVE_NETEM=1
else
    HAVE_NETEM=0
    log "no netem in this kernel: per-hop delays cannot be simulated; rate limit (tbf) only"
    DELAYS=0
fi

# --- the origin: tree P published -------------------------------------------------------
IMG=$WORK/P.sheaf
log "building and publishing tree P"
"$SHEAF" build -q "$DATA/P" -o "$IMG"
mkdir -p "$WORK/www"
"$SHEAF" publish -q "$IMG" "$WORK/www/repo" --name P >/dev/null 2>&1 || "$SHEAF" publish "$IMG" "$WORK/www/repo" --name P >/dev/null
IMAGE_BYTES=$(stat -c %s "$IMG")
mkdir -p "$WORK/nginx"
cat > "$WORK/nginx.conf" <<EOF
daemon off; master_process off; pid $WORK/nginx/pid; error_log $WORK/nginx/error.log;
events { worker_connections 1024; }
http { log_format b '\$body_bytes_sent'; access_log $WORK/nginx/access.log b; sendfile on;
       client_body_temp_path $WORK/nginx; proxy_temp_path $WORK/nginx; fastcgi_temp_path $WORK/nginx;
       uwsgi_temp_path $WORK/nginx; scgi_temp_path $WORK/nginx;
       server { listen $NET.1:80; root $WORK/www; } }
EOF
ip netns exec sc-origin nginx -e "$WORK/nginx/error.log" -c "$WORK/nginx.conf" </dev/null &
ORIGIN=http://$NET.1/repo/P
origin_bytes() { awk '{s+=$1} END {print s+0}' "$WORK/nginx/access.log"; }

# --- squid (memory cache, concurrent misses collapsed into one fetch) -------------------
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
start_squid() { start_squid_on "$NET.2:3128" "$WORK/squid" sc-proxy; }

# --- one round: N nodes at DELAY, all cold --------------------------------------------
# Sets ROUND="origin_bytes slowest_s mean_s" (in this shell: the namespaces it
# makes must be known to cleanup).
round() {
    local n=$1 delay=$2 i ns qd
    for i in $(seq 1 "$n"); do
        ns=sc-n$i
        if [ "$HAVE_NETEM" = 1 ]; then
            qd="netem rate $RATE"; [ "$delay" != 0 ] && qd="netem delay $delay rate $RATE"
        else
            qd="tbf rate $RATE burst 1mb latency 50ms"
        fi
        attach "$ns" $((10 + i)) "$qd"
        mkdir -p "$WORK/n$i/mnt" "$WORK/n$i/cache"
    done
    start_squid
    : > "$WORK/nginx/access.log"
    sync; echo 3 > /proc/sys/vm/drop_caches
    # Each node mounts, imports and unmounts in one `ip netns exec`: it
    # gives the command a mount namespace of its own, so a mount made in one
    # call is not seen by the next. The time covers the mount too.
    local pids=()
    for i in $(seq 1 "$n"); do
        ip netns exec "sc-n$i" bash -c '
            set -e
            s=$(date +%s.%N)
            "$1" mount --cache-dir "$2/cache" --proxy "$3" "$4" "$2/mnt"
            PYTHONPATH="$2/mnt" "$5" -c "$6" || { "$1" umount "$2/mnt"; exit 1; }
            e=$(date +%s.%N)
            "$1" umount "$2/mnt"
            echo "$s $e" > "$2/time"' _ "$SHEAF" "$WORK/n$i" "http://$NET.2:3128" "$ORIGIN" "$PYTHON" "$IMPORT" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || die "a node failed"; done
    for i in $(seq 1 "$n"); do
        ip netns pids "sc-n$i" | xargs -r kill 2>/dev/null || true
        ip netns del "sc-n$i"
        rm -rf "$WORK/n$i/cache"
    done
    stop_squid
    local times
    times=$(cat "$WORK"/n*/time | awk '{d=$2-$1; s+=d; if (d>m) m=d} END {printf "%.2f %.2f", m, s/NR}')
    rm -f "$WORK"/n*/time
    ROUND="$(origin_bytes) $times"
}

fanout_part() {
    {
        echo "# Simulated cluster: lazy fan-out of one image to N namespaced nodes ($(date +%Y-%m-%d))"
        echo
        echo "bench/cluster.sh: N network namespaces on a bridge, per node link $( [ "$HAVE_NETEM" = 1 ] && echo "netem (delay as given, rate $RATE)" || echo "tbf rate $RATE (no netem in this kernel: no added delay)"),"
        echo "origin nginx and one squid (memory cache, collapsed forwarding) in namespaces of their own; each node"
        echo "mounts the published repository of tree P (image $IMAGE_BYTES bytes) through squid with an empty node"
        echo "cache and runs a cold \`$IMPORT\`, all at once; page cache dropped before each round. One round per"
        echo "cell. 2 cores: at N=16 the nodes' Python processes share them, so wall time at large N measures the"
        echo "machine as much as sheaf (the mean per node shows it)."
        echo
        echo "| delay | N | origin bytes | / one node's | slowest node s | mean node s | slowest / N=1 |"
        echo "|---|---|---|---|---|---|---|"
    } >> "$OUT"
    for delay in $DELAYS; do
        one_bytes="" one_time=""
        for n in $NODES; do
            log "delay $delay, $n node(s)"
            round "$n" "$delay"
            read -r b slow mean <<< "$ROUND"
            [ -z "$one_bytes" ] && { one_bytes=$b; one_time=$slow; }
            printf '| %s | %s | %s | %.2fx | %s | %s | %.2fx |\n' "$delay" "$n" "$b" \
                "$(echo "$b / $one_bytes" | bc -l)" "$slow" "$mean" "$(echo "$slow / $one_time" | bc -l)" >> "$OUT"
        done
    done
}

# --- part 2: the broadcast across the namespaces ------------------------------------------
# The host namespace joins the bridge (mpirun runs there); PMIx then takes its
# clients' connections on the bridge, not on loopback, which a rank in
# another network namespace cannot reach.
bcast_part() {
    "$SHEAF" --version | grep -q "with MPI" || die "$SHEAF was built without MPI (make build with mpicc installed)"
    command -v mpicc >/dev/null || die "mpicc missing (scripts/deps.sh installs it)"
    mpicc -O2 -o "$WORK/swpool" "$ROOT/bench/swpool.c"
    netns_host $BR sc-host bh $NET.254/24
    mkdir -p "$WORK/local" "$WORK/nodes"
    cat > "$WORK/node.sh" <<EON
#!/bin/sh
n=\$((OMPI_COMM_WORLD_RANK + 1))
exec ip netns exec sc-n\$n unshare --mount --uts --propagation private sh -c "hostname node\$n && mount --bind $WORK/nodes/n\$n $WORK/local && exec \\"\\\$@\\"" sh "\$@"
EON
    chmod +x "$WORK/node.sh"
    export PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=$NET.0/24
    mpi() {
        local n=$1; shift
        mpirun --allow-run-as-root --oversubscribe -np "$n" --mca btl self,tcp \
            --mca btl_tcp_if_include $NET.0/24 --mca oob_tcp_if_include $NET.0/24 \
            -x PMIX_MCA_ptl_tcp_remote_connections -x PMIX_MCA_ptl_tcp_if_include \
            "$WORK/node.sh" "$@"
    }
    json() { python3 -c "import json,sys; d=json.loads([l for l in sys.stdin.read().splitlines() if l.startswith('{')][0]); print(d['$1'])"; }
    local srcs=() img
    for img in $BIMAGES; do
        case $img in
            random)
                mkdir -p "$WORK/random"
                head -c $((SIZE_MB << 20)) /dev/urandom > "$WORK/random/data.bin"
                "$SHEAF" build -q "$WORK/random" -o "$WORK/random.sheaf"
                rm -rf "$WORK/random"
                srcs+=("$WORK/random.sheaf") ;;
            P) srcs+=("$IMG") ;;
            *) die "BIMAGES: random or P, not $img" ;;
        esac
    done
    {
        echo
        echo "## Broadcast to N namespaced nodes over MPI TCP ($(date +%Y-%m-%d))"
        echo
        echo "Open MPI $(mpirun --version | head -1 | awk '{print $NF}'), mpirun in the host namespace on the bridge, one rank per node"
        echo "namespace (own host name and node-local directory); per node link tbf at the rate given (no netem:"
        echo "no added delay). Shared storage = this machine's disk, page cache dropped before each run; every node's"
        echo "copy compared with the source. sw-pool = bench/swpool.c (striped read, one MPI_Bcast per 4 KiB block);"
        echo "sheaf = sheaf bcast. Times: wall clock around mpirun (its start-up included); one run per cell."
        echo
        echo "| image | rate | N | sw-pool s | sheaf s | sw-pool / sheaf | read ×image: sw-pool | sheaf |"
        echo "|---|---|---|---|---|---|---|---|"
    } >> "$OUT"
    local rate n i src size t0 t1 tb tc rb rc
    for rate in $BRATES; do
        for n in $BNODES; do
            for i in $(seq 1 "$n"); do attach "sc-n$i" $((10 + i)) "tbf rate $rate burst 1mb latency 50ms"; done
            for src in "${srcs[@]}"; do
                size=$(stat -c %s "$src")
                fresh() { rm -rf "$WORK"/nodes/n*; for i in $(seq 1 "$n"); do mkdir -p "$WORK/nodes/n$i"; done; }
                check() { for i in $(seq 1 "$n"); do cmp -s "$src" "$WORK/nodes/n$i/p.sheaf" || die "$1: node $i's copy differs"; done; }
                log "bcast $(basename "$src") to $n nodes at $rate"
                fresh; sync; echo 3 > /proc/sys/vm/drop_caches
                t0=$(date +%s.%N); rb=$(mpi "$n" "$WORK/swpool" "$src" "$WORK/local/p.sheaf" | json bytes_read); t1=$(date +%s.%N)
                tb=$(echo "$t1 - $t0" | bc); check sw-pool
                fresh; sync; echo 3 > /proc/sys/vm/drop_caches
                t0=$(date +%s.%N); rc=$(mpi "$n" "$SHEAF" bcast --json "$src" "$WORK/local/p.sheaf" | json bytes_read); t1=$(date +%s.%N)
                tc=$(echo "$t1 - $t0" | bc); check sheaf
                printf '| %s (%d MiB) | %s | %s | %.2f | %.2f | %.2fx | %.3f | %.3f |\n' "$(basename "$src" .sheaf)" $((size >> 20)) \
                    "$rate" "$n" "$tb" "$tc" "$(echo "$tb / $tc" | bc -l)" "$(echo "$rb / $size" | bc -l)" "$(echo "$rc / $size" | bc -l)" >> "$OUT"
            done
            rm -rf "$WORK"/nodes/n*
            for i in $(seq 1 "$n"); do ip netns del "sc-n$i"; done
        done
    done
}

: > "$OUT"
for part in $PARTS; do
    case $part in
        fanout) fanout_part ;;
        bcast) bcast_part ;;
        *) die "PARTS: fanout and/or bcast, not $part" ;;
    esac
done
log "wrote $OUT"
cat "$OUT"
