#!/usr/bin/env bash
# Lazy remote image benchmark: sheaf mount of http:// URLs served by a real nginx on
# 127.0.0.1, with loopback shaped to ~5 ms RTT and 1 Gbit/s (tc netem) for the timed
# runs. Writes bench/results/DATE-http.md.
#
# 1. Cold `import numpy, scipy.linalg, pandas` from tree P: (a) local image file,
#    (b) the same image as a whole-file URL, (c) its published repository form,
#    (d) the repository with a recorded prefetch list (-o prefetch=), (f) an image built
#    with that list (build --prefetch), (e) curl the whole image, then mount it locally.
#    Wall time, bytes fetched over HTTP, share of the image.
# 2. One ~5% hyperslab of a ~1 GB HDF5 file (h5py) read from a URL image: bytes
#    fetched against the stored size of the blocks that hold the hyperslab.
# 3. A second version P2 of tree P (a few packages changed) published into the same
#    repository: what the mount of P2 fetches with a node cache warm from P.
# "Cold" = fresh mount (new serving process), empty node cache, page cache dropped.
#
# Usage: bench/http.sh             (after bench/setup.sh K P; run as root)
# Env:   SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench), PYTHON (default python3),
#        RUNS (runs per case in part 1, default 3), SHAPE (netem|tbf|none; default:
#        netem, else tbf (bandwidth only), else none), REBUILD_SHEAF=1 (rebuild the
#        sheaf images even when newer than the binary)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
IMAGES=$DATA/images
PYTHON=${PYTHON:-python3}
RUNS=${RUNS:-3}
CASES="a b c d f g h e"
IMPORT="import numpy, scipy.linalg, pandas"
# Part 3 uses mount.sh's wider import: it loads networkx.algorithms.flow, which P2 changes.
IMPORT_FULL="import numpy, scipy.linalg, scipy.sparse, pandas, sklearn.ensemble, matplotlib.pyplot, sympy, h5py, networkx"
P2_CHANGED=(networkx/algorithms/flow sympy/physics)   # every .py gets one comment line more
H5_ROWS=16384 H5_COLS=8192 H5_SLAB=819                # float64: 1 GiB file, 5% slab
NETEM="netem delay 2500us rate 1gbit"                 # on lo: ~5 ms RTT, 1 Gbit/s
TBF="tbf rate 1gbit burst 1mb latency 50ms"           # fallback: bandwidth only
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-http.md

log() { printf '[http-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (drop_caches, tc on lo)"
[ -x "$SHEAF" ] || die "$SHEAF missing: run make build"
[ -d "$DATA/P" ] || die "$DATA/P missing: run bench/setup.sh K P"
command -v nginx >/dev/null || die "nginx missing (apt-get install nginx-light)"
command -v curl >/dev/null || die "curl missing (apt-get install curl)"
PYTHONPATH="$DATA/P" "$PYTHON" -c "import numpy, h5py" 2>/dev/null || die "$PYTHON cannot import numpy/h5py from $DATA/P"
mkdir -p "$IMAGES" "$ROOT/bench/results"

WORK=$(mktemp -d "$DATA/http.XXXXXX")     # www, node caches, downloads, logs
MP=$(mktemp -d /tmp/sheaf-bench-http-mnt.XXXXXX)
WWW=$WORK/www MLOG=$WORK/mount.log
mkdir -p "$WWW"

# --- loopback shaping (only around the measured runs) -----------------------------------
SHAPED=0 QDISC=""
shape_on()  { [ -z "$QDISC" ] && return 0; SHAPED=1; tc qdisc add dev lo root $QDISC; }
shape_off() { [ "$SHAPED" = 1 ] || return 0; tc qdisc del dev lo root 2>/dev/null || true; SHAPED=0; }

# --- nginx --------------------------------------------------------------------------------
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

MOUNTED=0
cleanup() {
    local rc=$?
    shape_off
    if [ "$MOUNTED" = 1 ]; then "$SHEAF" umount "$MP" 2>/dev/null || fusermount3 -u "$MP" 2>/dev/null || true; fi
    [ -n "$NGINX_PID" ] && { kill "$NGINX_PID" 2>/dev/null; wait "$NGINX_PID" 2>/dev/null || true; }
    [ -n "${DELAY_PID:-}" ] && { kill "$DELAY_PID" 2>/dev/null || true; }
    if [ "$rc" != 0 ] && [ -s "$MLOG" ]; then log "last lines of the mount log:"; grep -v -e 'Not Implemented' -e '^ ' -e '^)' "$MLOG" | tail -n 20 >&2; fi
    rm -rf "$WORK"; rmdir "$MP" 2>/dev/null || true
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now_ns() { date +%s%N; }
secs() { awk -v n="$1" 'BEGIN { printf "%.2f", n / 1e9 }'; }
mb() { awk -v n="$1" 'BEGIN { printf "%.1f", n / 1e6 }'; }
calc() { local f=$1 e=$2; shift 2; awk -v f="$f" "BEGIN { a=$1; b=${2:-0}; c=${3:-0}; printf f, $e }"; }
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
verdict() { awk -v x="$1" -v t="$2" 'BEGIN { print (x <= t) ? "met" : "MISSED" }'; }
jget() { "$PYTHON" -c 'import json, sys
d = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d = d[k]
print(d)' "$@"; }

# --- mounts -------------------------------------------------------------------------------
# mnt SRC CACHE [OPTS]: mount SRC (file or URL) with node cache CACHE.
mnt() {
    "$SHEAF" --cache-dir "$2" mount -o "log=$MLOG${3:+,$3}" "$1" "$MP"
    MOUNTED=1
}
umnt() { "$SHEAF" umount "$MP"; MOUNTED=0; }
# Wait until the mount's background fetches are over (remote.http_bytes and
# prefetch.background_bytes unchanged for 1 s; at most 60 s), then leave its stats in FILE.
settle() {
    local f=$1 prev="" cur same=0 i
    for i in $(seq 240); do
        "$SHEAF" stats --json "$MP" > "$f"
        cur=$("$PYTHON" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print((d.get("remote") or {}).get("http_bytes", 0), (d.get("prefetch") or {}).get("background_bytes", 0))' "$f")
        [ -z "${DEBUG_SETTLE:-}" ] || log "settle $i: http_bytes, background_bytes = $cur"
        if [ "$cur" = "$prev" ]; then same=$((same + 1)); [ $same -ge 4 ] && return 0; else same=0; fi
        prev=$cur; sleep 0.25
    done
    log "warning: background fetches still running after 60 s"
}
py_in() { # py_in PYTHONPATH CODE: run python in /tmp (no bytecode written)
    (cd /tmp && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$1" timeout 900 "$PYTHON" -c "$2")
}
fresh_cache() { local c; c=$(mktemp -d "$WORK/cache.XXXXXX"); echo "$c"; }

# --- images (rebuilt when older than the binary, or with REBUILD_SHEAF=1) ---------------
image() { # image NAME DIR -> $IMAGES/NAME.sheaf
    local img=$IMAGES/$1.sheaf
    if [ "${REBUILD_SHEAF:-0}" = 1 ] || [ ! -f "$img" ] || [ "$img" -ot "$SHEAF" ] || [ "$img" -ot "$2" ]; then
        log "building $img from $2"
        rm -f "$img"; "$SHEAF" build -q "$2" -o "$img.tmp"; mv "$img.tmp" "$img"
    fi
    echo "$img"
}

# Tree P2: P with every .py of a few small packages one comment line longer (and their
# .pyc recompiled, as a new release would ship them). Cached under $DATA.
if [ ! -f "$DATA/.P2.done" ] || [ ! -d "$DATA/P2" ]; then
    log "P2: copying P and changing ${P2_CHANGED[*]}"
    rm -rf "$DATA/P2" "$DATA/P2.tmp"
    cp -a "$DATA/P" "$DATA/P2.tmp"
    for d in "${P2_CHANGED[@]}"; do
        [ -d "$DATA/P2.tmp/$d" ] || die "P2: $d not in tree P"
        find "$DATA/P2.tmp/$d" -name '*.py' -exec sh -c 'for f; do echo "# sheaf-bench P2" >> "$f"; done' sh {} +
        "$PYTHON" -m compileall -q -f "$DATA/P2.tmp/$d" >/dev/null
    done
    mv "$DATA/P2.tmp" "$DATA/P2"
    touch "$DATA/.P2.done"
fi
P2_FILES=0 P2_BYTES=0   # .py changed; bytes of the changed .py and their .pyc
for d in "${P2_CHANGED[@]}"; do
    P2_FILES=$((P2_FILES + $(find "$DATA/P2/$d" -name '*.py' | wc -l)))
    P2_BYTES=$((P2_BYTES + $(find "$DATA/P2/$d" -type f \( -name '*.py' -o -name '*.pyc' \) -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')))
done

# HDF5 file: float64 H5_ROWS x H5_COLS, contiguous, uncompressed; smooth values plus
# noise, rounded to float32 precision so that it compresses somewhat. Cached under $DATA.
if [ ! -f "$DATA/.H5.done" ] || [ ! -f "$DATA/H5/big.h5" ]; then
    log "H5: writing a $H5_ROWS x $H5_COLS float64 dataset"
    rm -rf "$DATA/H5" "$DATA/H5.tmp"; mkdir "$DATA/H5.tmp"
    py_in "$DATA/P" "
import numpy as np, h5py
rng = np.random.default_rng(42)
R, C = $H5_ROWS, $H5_COLS
with h5py.File('$DATA/H5.tmp/big.h5', 'w') as f:
    ds = f.create_dataset('x', shape=(R, C), dtype='f8')
    j = np.arange(C)[None, :]
    for r in range(0, R, 512):
        i = np.arange(r, r + 512)[:, None]
        v = np.sin(i * 0.003 + j * 0.002) * np.cos(j * 0.0007) + rng.normal(0, 0.01, (512, C))
        ds[r:r + 512] = v.astype(np.float32).astype(np.float64)
"
    mv "$DATA/H5.tmp" "$DATA/H5"
    touch "$DATA/.H5.done"
fi

IMG_P=$(image P "$DATA/P")
IMG_P2=$(image P2 "$DATA/P2")
IMG_H5=$(image H5 "$DATA/H5")
SIZE_P=$(stat -c %s "$IMG_P")

# --- serve --------------------------------------------------------------------------------
ln -s "$IMG_P" "$WWW/P.sheaf"
ln -s "$IMG_H5" "$WWW/H5.sheaf"
log "publishing P and P2 into one repository"
"$SHEAF" publish --json "$IMG_P" "$WWW/repo" --name P > "$WORK/pub-P.json"
"$SHEAF" publish --json "$IMG_P2" "$WWW/repo" --name P2 > "$WORK/pub-P2.json"
start_nginx
log "nginx on $BASE"

# Which shaping works here? (lo has no root qdisc of its own by default: keep it so.)
SHAPE_NOTE=""
if tc qdisc show dev lo 2>/dev/null | grep -q '^qdisc noqueue 0: root'; then
    for kind in ${SHAPE:-netem tbf}; do
        case $kind in netem) q=$NETEM ;; tbf) q=$TBF ;; *) continue ;; esac
        if tc qdisc add dev lo root $q 2>/dev/null; then
            tc qdisc del dev lo root; QDISC=$q; break
        fi
    done
    case $QDISC in
        netem*) SHAPE_NOTE="Loopback shaped during the timed runs with \`tc qdisc add dev lo root $NETEM\` (≈5 ms RTT, 1 Gbit/s)." ;;
        tbf*)   SHAPE_NOTE="**netem is not available in this kernel** (\`tc qdisc add dev lo root $NETEM\`: unknown qdisc kind), so there is NO added latency (plain loopback RTT): loopback was only limited to 1 Gbit/s during the timed runs, with \`tc qdisc add dev lo root $TBF\`. Remote times are therefore optimistic for a real network." ;;
        *)      SHAPE_NOTE="**No traffic shaping** (netem and tbf unavailable or SHAPE=none): loopback at full speed, no added latency. Remote times are optimistic for a real network." ;;
    esac
else
    SHAPE_NOTE="**No traffic shaping**: lo already has a root qdisc ($(tc qdisc show dev lo | head -1)), left alone."
fi
log "shaping: ${QDISC:-none}"

declare -A R
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
# --- part 1: cold imports -----------------------------------------------------------------
# run1 CASE: one cold run; appends to R[CASE,ns] / R[CASE,bytes] / R[CASE,reqs].
run1() {
    local k=$1 c s e st=$WORK/stats.json bytes reqs served
    c=$(fresh_cache)
    drop_caches
    case $k in
        a) s=$(now_ns); mnt "$IMG_P" "$c"; py_in "$MP" "$IMPORT"; e=$(now_ns)
           settle "$st"; bytes=0; reqs=0 ;;
        b|c|d|f|g|h)
           local url=$BASE/P.sheaf opts=""
           case $k in c|d) url=$BASE/repo/P ;; f) url=$BASE/repo/Pprefetch ;; g) url=$DBASE/repo/P ;; h) url=$DBASE/repo/Pprefetch ;; esac
           [ "$k" = d ] && opts="prefetch=$WORK/P.list"
           shape_on
           s=$(now_ns); mnt "$url" "$c" "$opts"; py_in "$MP" "$IMPORT"; e=$(now_ns)
           settle "$st"
           shape_off
           bytes=$(jget "$st" remote.http_bytes); reqs=$(jget "$st" remote.http_requests) ;;
        e) local dl=$WORK/dl.sheaf
           shape_on
           s=$(now_ns)
           curl -sf -o "$dl" "$BASE/P.sheaf"
           mnt "$dl" "$c"; py_in "$MP" "$IMPORT"; e=$(now_ns)
           shape_off
           settle "$st"; bytes=$(stat -c %s "$dl"); reqs=1 ;;
    esac
    served=$(jget "$st" bytes_served)
    umnt
    rm -rf "$c" "$WORK/dl.sheaf"
    R[$k,ns]+=" $((e - s))"; R[$k,bytes]+=" $bytes"; R[$k,reqs]+=" $reqs"; R[$k,served]+=" $served"
    log "  $k: $(secs $((e - s))) s, $(mb "$bytes") MB in $reqs requests"
}

log "part 1: recording the files the import reads (warm-up, not timed)"
c=$(fresh_cache)
mnt "$BASE/repo/P" "$c" "record=$WORK/P.list"
py_in "$MP" "$IMPORT"
umnt; rm -rf "$c"
[ -s "$WORK/P.list" ] || die "record= wrote no list ($WORK/P.list)"
R[list_files]=$(wc -l < "$WORK/P.list")
# (f): the same list given to `sheaf build --prefetch` (its files' data first, in a prefetch
# section that mounts fetch by themselves), published into the same repository.
log "part 1: building P with --prefetch (the recorded list) and publishing it"
"$SHEAF" build -q --prefetch "$WORK/P.list" "$DATA/P" -o "$WORK/Pprefetch.sheaf"
"$SHEAF" publish --json "$WORK/Pprefetch.sheaf" "$WWW/repo" --name Pprefetch > "$WORK/pub-Pprefetch.json"
SIZE_PF=$(stat -c %s "$WORK/Pprefetch.sheaf")
rm -f "$WORK/Pprefetch.sheaf"

# Latency stand-in (netem is missing here): the test suite's fault proxy in front of nginx,
# waiting 5 ms before answering each request, like a 5 ms round trip per request.
coproc DELAY { exec "$PYTHON" "$ROOT/crates/sheaf-cli/tests/support/faultproxy.py" "$BASE" "delay=5"; }
DELAY_PID=$DELAY_PID
read -r DPORT <&"${DELAY[0]}"
DBASE=http://127.0.0.1:$DPORT

# Interleaved rounds, so that drift hits every case alike.
for i in $(seq "$RUNS"); do
    log "part 1: round $i/$RUNS"
    for k in $CASES; do run1 $k; done
done
for k in $CASES; do
    # shellcheck disable=SC2086
    { R[$k,t]=$(median ${R[$k,ns]}); R[$k,b]=$(median ${R[$k,bytes]}); R[$k,r]=$(median ${R[$k,reqs]}); R[$k,s]=$(median ${R[$k,served]}); }
done

# --- part 2: HDF5 hyperslab ---------------------------------------------------------------
log "part 2: h5py hyperslab from a URL image"
"$SHEAF" info --json "$IMG_H5" > "$WORK/h5info.json"
H5_BS=$(jget "$WORK/h5info.json" block_size)
H5_STORED=$(jget "$WORK/h5info.json" stored_data_bytes)
H5_LOGICAL=$(jget "$WORK/h5info.json" logical_bytes)
H5_IMG=$(stat -c %s "$IMG_H5")
read -r H5_OFF H5_SUM < <(py_in "$DATA/P" "
import h5py
with h5py.File('$DATA/H5/big.h5', 'r') as f:
    ds = f['x']
    print(ds.id.get_offset(), repr(float(ds[0:$H5_SLAB, :].sum())))
")
H5_LEN=$((H5_SLAB * H5_COLS * 8))
H5_FIRST=$((H5_OFF / H5_BS)) H5_LAST=$(((H5_OFF + H5_LEN - 1) / H5_BS))
H5_NBLK=$((H5_LAST - H5_FIRST + 1))
H5_NEED=$(awk -v n="$H5_NBLK" -v bs="$H5_BS" -v l="$H5_LOGICAL" -v s="$H5_STORED" 'BEGIN { printf "%.0f", n * bs / l * s }')
c=$(fresh_cache)
drop_caches
shape_on
s=$(now_ns)
mnt "$BASE/H5.sheaf" "$c"
got=$(py_in "$DATA/P" "
import h5py
with h5py.File('$MP/big.h5', 'r') as f:
    print(repr(float(f['x'][0:$H5_SLAB, :].sum())))
")
e=$(now_ns)
settle "$WORK/stats.json"
shape_off
umnt; rm -rf "$c"
[ "$got" = "$H5_SUM" ] || die "hyperslab over HTTP sums to $got, the local file to $H5_SUM"
R[h5,t]=$((e - s))
R[h5,b]=$(jget "$WORK/stats.json" remote.http_bytes)
R[h5,r]=$(jget "$WORK/stats.json" remote.http_requests)
log "  $(secs "${R[h5,t]}") s, $(mb "${R[h5,b]}") MB in ${R[h5,r]} requests; blocks $H5_FIRST..$H5_LAST ≈ $(mb "$H5_NEED") MB stored"

# --- part 3: a second version, one node cache ---------------------------------------------
log "part 3: P then P2 from the repository, one node cache"
c=$(fresh_cache)
for v in P P2; do
    drop_caches
    shape_on
    s=$(now_ns)
    mnt "$BASE/repo/$v" "$c"
    py_in "$MP" "$IMPORT_FULL"
    e=$(now_ns)
    settle "$WORK/stats.json"
    shape_off
    umnt
    R[v$v,t]=$((e - s))
    R[v$v,b]=$(jget "$WORK/stats.json" remote.http_bytes)
    R[v$v,r]=$(jget "$WORK/stats.json" remote.http_requests)
    R[v$v,hits]=$(jget "$WORK/stats.json" disk_cache.disk_cache_hits)
    log "  $v: $(secs "${R[v$v,t]}") s, $(mb "${R[v$v,b]}") MB in ${R[v$v,r]} requests, ${R[v$v,hits]} node-cache hits"
done
rm -rf "$c"
for v in P P2; do
    for f in objects_written objects_reused bytes_written index_bytes; do R[pub$v,$f]=$(jget "$WORK/pub-$v.json" $f); done
done

# --- report -------------------------------------------------------------------------------
g() { echo "${R[$1]:-}"; }
ta=$(g a,t)
row() { # row CASE LABEL
    local k=$1 t b x frac
    t=$(g "$k,t"); b=$(g "$k,b"); x=$(calc '%.2f' a/b "$t" "$ta")
    frac=$(calc '%.1f' '100*a/b' "$b" "$SIZE_P")
    # shellcheck disable=SC2086
    echo "| $2 | $(secs "$t") ($(for n in ${R[$k,ns]}; do printf '%s ' "$(secs "$n")"; done | sed 's/ $//')) | $(mb "$(g "$k,s")") | $(mb "$b") | $(g "$k,r") | $frac% | ${x}× |"
}
{
    echo "# sheaf lazy remote image benchmark, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "Machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2/1048576 }' /proc/meminfo), kernel $(uname -r)."
    echo "sheaf $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD -- crates Cargo.lock 2>/dev/null || echo ' (+ uncommitted changes)'); $(nginx -v 2>&1 | sed 's/^nginx version: //') on 127.0.0.1; $("$PYTHON" --version 2>&1)."
    echo "Load average (1/5/15 min) when the measurements started: $LOAD_START; at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "$SHAPE_NOTE"
    echo
    echo "## 1. Cold \`$IMPORT\` (tree P)"
    echo
    echo "Image P.sheaf: $(mb "$SIZE_P") MB (default build: zstd:12, 4 MiB blocks; built with \`--prefetch\` for f: $(mb "$SIZE_PF") MB). Wall time = mount + import"
    echo "(for e: download + mount + import); median of $RUNS interleaved rounds, the runs in brackets."
    echo "MB read by Python = \`bytes_served\` (file bytes the mount returned, uncompressed); MB fetched = \`remote.http_bytes\`"
    echo "of \`sheaf stats --json\` just before unmount, once background fetches are done (medians)."
    echo
    echo "| case | wall s (runs) | MB read by Python | MB fetched | HTTP requests | fetched / image | time vs (a) |"
    echo "|---|---|---|---|---|---|---|"
    row a "a. local image file"
    row b "b. whole-file URL (…/P.sheaf), empty node cache"
    row c "c. repository (…/repo/P), empty node cache"
    row d "d. repository + \`-o prefetch=\` ($(g list_files) recorded files), empty node cache"
    row f "f. repository of an image built with \`--prefetch\` (the same list), empty node cache"
    row g "g. as c, through a proxy adding 5 ms per request (latency stand-in)"
    row h "h. as f, through the same 5 ms proxy"
    row e "e. \`curl -o\` the image, then mount it locally"
    echo
    echo "## 2. h5py hyperslab of a $(mb "$H5_LOGICAL") MB HDF5 file over HTTP"
    echo
    echo "Dataset float64 ${H5_ROWS}×${H5_COLS}, contiguous, no HDF5 compression; image H5.sheaf $(mb "$H5_IMG") MB"
    echo "(stored data $(mb "$H5_STORED") MB, block size $((H5_BS >> 20)) MiB). Read: rows 0..$((H5_SLAB - 1)), full width = $(mb "$H5_LEN") MB"
    echo "($(calc '%.1f' '100*a/b' "$H5_LEN" "$H5_LOGICAL")% of the file) at file offset $H5_OFF, i.e. blocks $H5_FIRST..$H5_LAST ($H5_NBLK blocks)."
    echo "The hyperslab's sum matches the one read from the local file."
    echo
    echo "| measure | value |"
    echo "|---|---|"
    echo "| wall s (mount + open + read) | $(secs "$(g h5,t)") |"
    echo "| MB fetched (HTTP requests) | $(mb "$(g h5,b)") ($(g h5,r)) |"
    echo "| stored MB of the $H5_NBLK blocks holding the hyperslab (estimate) | $(mb "$H5_NEED") |"
    echo "| fetched / those blocks | $(calc '%.2f' a/b "$(g h5,b)" "$H5_NEED")× |"
    echo "| fetched / image | $(calc '%.1f' '100*a/b' "$(g h5,b)" "$H5_IMG")% |"
    echo
    echo "## 3. Second version P2 in the same repository, one node cache"
    echo
    echo "P2 = P with the $P2_FILES .py files under ${P2_CHANGED[*]} one comment line longer (.pyc recompiled):"
    echo "$(mb "$P2_BYTES") MB of files changed ($(calc '%.1f' '100*a/b' "$P2_BYTES" "$(du -sb "$DATA/P" | cut -f1)")% of tree P's bytes)."
    echo "Import: \`$IMPORT_FULL\` (loads networkx.algorithms.flow, which changed)."
    echo
    echo "| measure | P | P2 |"
    echo "|---|---|---|"
    echo "| \`sheaf publish\`: objects written / reused | $(g pubP,objects_written) / $(g pubP,objects_reused) | $(g pubP2,objects_written) / $(g pubP2,objects_reused) |"
    echo "| \`sheaf publish\`: MB of objects written (+ index MB) | $(mb "$(g pubP,bytes_written)") (+ $(mb "$(g pubP,index_bytes)")) | $(mb "$(g pubP2,bytes_written)") (+ $(mb "$(g pubP2,index_bytes)")) |"
    echo "| new objects / changed file bytes | | $(calc '%.1f' a/b "$(g pubP2,bytes_written)" "$P2_BYTES")× |"
    echo "| mount + import wall s (P first, then P2) | $(secs "$(g vP,t)") | $(secs "$(g vP2,t)") |"
    echo "| MB fetched (HTTP requests) | $(mb "$(g vP,b)") ($(g vP,r)) | $(mb "$(g vP2,b)") ($(g vP2,r)) |"
    echo "| node-cache hits | $(g vP,hits) | $(g vP2,hits) |"
    echo
    echo "## Targets (same run)"
    echo
    echo "| target | value | verdict |"
    echo "|---|---|---|"
    for k in b c d f; do
        x=$(calc '%.1f' '100*a/b' "$(g "$k,b")" "$SIZE_P"); echo "| ($k) bytes fetched ≤ 10% of the image | $x% | $(verdict "$x" 10) |"
    done
    for k in b c; do
        x=$(calc '%.2f' a/b "$(g "$k,t")" "$ta"); echo "| ($k) cold import ≤ 2× local image | ${x}× | $(verdict "$x" 2) |"
    done
    x=$(calc '%.2f' a/b "$(g d,t)" "$ta"); echo "| (d) cold import with prefetch list ≤ 1.3× local image | ${x}× | $(verdict "$x" 1.3) |"
    x=$(calc '%.2f' a/b "$(g f,t)" "$ta"); echo "| (f) the same, list built into the image ≤ 1.3× local image | ${x}× | $(verdict "$x" 1.3) |"
    x=$(calc '%.2f' a/b "$(g g,t)" "$ta"); echo "| (g) as (c) with 5 ms per request ≤ 2× local image | ${x}× | $(verdict "$x" 2) |"
    x=$(calc '%.2f' a/b "$(g h,t)" "$ta"); echo "| (h) as (f) with 5 ms per request ≤ 1.3× local image | ${x}× | $(verdict "$x" 1.3) |"
    x=$(calc '%.2f' a/b "$(g h5,b)" "$H5_NEED"); echo "| HDF5 hyperslab: fetched ≤ 1.2× stored size of its blocks | ${x}× | $(verdict "$x" 1.2) |"
    n2=$(( $(g pubP2,bytes_written) + $(g pubP2,index_bytes) ))
    x=$(calc '%.2f' a/b "$(g vP2,b)" "$n2"); echo "| P2 after P: fetched ≈ new objects of P2 (+ its index) | ${x}× of $(mb "$n2") MB | $(verdict "$x" 1.2) |"
    echo
    echo "## How measured"
    echo
    echo "bench/http.sh serves a temporary directory under $DATA with nginx ($(nginx -v 2>&1 | sed 's/^nginx version: //'),"
    echo "\`daemon off; master_process off\`, static files, Range requests) on 127.0.0.1: the image files themselves (whole-file"
    echo "URLs) and a repository written by \`sheaf publish\` (P and P2, then the \`--prefetch\` build of P, into one directory)."
    echo "Every remote mount gets its own empty \`--cache-dir\` (part 3: one cache shared by the P and the P2 mount), and every"
    echo "run starts with \`sync; echo 3 > /proc/sys/vm/drop_caches\`, so the server reads the image from disk too. Shaping is"
    echo "on only from just before the mount (or the download) until the mount's stats are taken. Times are wall clock from"
    echo "before \`sheaf mount\` until Python exits. Bytes are \`remote.http_bytes\` (all HTTP body bytes: index, metadata pages"
    echo "prefetched at mount, blocks, prefetch list) read with \`sheaf stats --json\` once the mount's background fetches have"
    echo "stopped (\`http_bytes\` and \`prefetch.background_bytes\` unchanged for 1 s); for (e) the downloaded size."
    echo "(d) and (f) use the list of files recorded with \`-o record=\` by one untimed run of the same import (repository"
    echo "form, empty cache): (d) passes it as \`-o prefetch=LIST\`, (f) is P rebuilt with \`sheaf build --prefetch LIST\`."
    echo "HDF5: the stored size of the blocks that hold the hyperslab is estimated as (blocks touched × block size /"
    echo "logical bytes) × stored data bytes, from \`sheaf info --json\` (the image holds one file of uniformly compressible"
    echo "data, so its blocks compress alike); blocks touched = the hyperslab's byte range in the file (dataset offset from"
    echo "h5py's \`get_offset()\`, length rows × row bytes) cut into $((H5_BS >> 20)) MiB blocks. Part 3's verdict compares what"
    echo "the P2 mount fetched with what \`sheaf publish\` wrote for P2 (new objects + index): whether a node cache warm from P"
    echo "limits the update to objects that changed. How many objects change for a small edit is in the table above."
} > "$OUT"
cat "$OUT"
log "wrote $OUT"
