#!/usr/bin/env bash
# The default-image decision (issue 15 §3): which pack size the default image
# uses. For each candidate, in one run against mksquashfs-zstd and the kernel's
# squashfs on the same trees:
#   size of K and P (≤ 0.95× squashfs), build wall time (≤ 0.5× mksquashfs;
#   page cache dropped before each build, one build each),
#   5000 random files of K read by 4 parallel cat on a fresh mount after
#   drop_caches (≤ 0.5× kernel; median of 3),
#   cold import of the scientific stack from P (≤ 1.1× kernel; median of 3),
#   lazy `import numpy, scipy.linalg, pandas` from the image over HTTP (a real
#   nginx on loopback, empty node cache): bytes fetched / image (≤ 15%).
# Writes bench/results/DATE-default-image.md.
#
# Usage: bench/default-image.sh      (after bench/setup.sh K P; run as root)
# Env:   PACKS (default "256K 256K+nodict 512K 4M": pack size, @N the zstd
#        level if not 12, +nodict for --no-dict; 4M = the 4 MiB block size),
#        SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench), PYTHON, RUNS (default 3)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
PACKS=${PACKS:-"256K 256K+nodict 512K 4M"}
PYTHON=${PYTHON:-python3}
RUNS=${RUNS:-3}
IMPORT="import numpy, scipy.linalg, scipy.sparse, pandas, sklearn.ensemble, matplotlib.pyplot, sympy, h5py, networkx"
LAZY_IMPORT="import numpy, scipy.linalg, pandas"
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-default-image.md

log() { printf '[default-image %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (loop mounts, drop_caches)"
[ -x "$SHEAF" ] || die "$SHEAF missing: run make build"
for t in K P; do [ -d "$DATA/$t" ] || die "$DATA/$t missing: run bench/setup.sh K P"; done
command -v mksquashfs >/dev/null || die "mksquashfs missing (apt-get install squashfs-tools)"
command -v nginx >/dev/null || die "nginx missing (apt-get install nginx-light)"

WORK=$(mktemp -d "$DATA/default-image.XXXXXX")
MP=$(mktemp -d /tmp/sheaf-bench-default.XXXXXX)
CUR=""
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
umnt() {
    case $CUR in "") ;; sqfs) umount "$MP" ;; *) "$SHEAF" umount "$MP" ;; esac
    CUR=""
}
cleanup() {
    umnt 2>/dev/null || true
    [ -n "$NGINX_PID" ] && { kill "$NGINX_PID" 2>/dev/null; wait "$NGINX_PID" 2>/dev/null || true; }
    rm -rf "$WORK"; rmdir "$MP" 2>/dev/null || true
}
trap cleanup EXIT

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now_ns() { date +%s%N; }
secs() { awk -v n="$1" 'BEGIN { printf "%.2f", n / 1e9 }'; }
mb() { awk -v n="$1" 'BEGIN { printf "%.1f", n / 1e6 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
verdict() { awk -v x="$1" -v t="$2" 'BEGIN { print (x <= t) ? "met" : "MISSED" }'; }

level() { local l=${1%+nodict}; case $l in *@*) echo "${l#*@}" ;; *) echo 12 ;; esac; }
size_of() { local l=${1%+nodict}; echo "${l%@*}"; }
dict_flag() { case $1 in *+nodict) echo --no-dict ;; esac; }
declare -A R
# --- builds -------------------------------------------------------------------------------
timed_build() { # timed_build KEY CMD...: wall ns into R[KEY,build]
    local key=$1 s e; shift
    drop_caches
    s=$(now_ns); "$@" >/dev/null; e=$(now_ns)
    R[$key,build]=$((e - s))
}
for t in K P; do
    log "mksquashfs $t"
    timed_build "sqfs,$t" mksquashfs "$DATA/$t" "$WORK/$t.sqfs" -noappend -comp zstd -quiet -no-progress
    R[sqfs,$t,size]=$(stat -c %s "$WORK/$t.sqfs")
    for p in $PACKS; do
        log "sheaf build $t --pack-size $(size_of "$p") -c zstd:$(level "$p") $(dict_flag "$p")"
        # shellcheck disable=SC2046
        timed_build "$p,$t" "$SHEAF" build -q --pack-size "$(size_of "$p")" -c "zstd:$(level "$p")" $(dict_flag "$p") "$DATA/$t" -o "$WORK/$t-${p/@/-z}.sheaf"
        R[$p,$t,size]=$(stat -c %s "$WORK/$t-${p/@/-z}.sheaf")
    done
done

# --- mounted reads ---------------------------------------------------------------------------
mnt() { # mnt KIND TREE
    case $1 in
        sqfs) mount -t squashfs -o loop,ro "$WORK/$2.sqfs" "$MP" ;;
        *) "$SHEAF" mount "$WORK/$2-${1/@/-z}.sheaf" "$MP" ;;
    esac
    CUR=$1
}
cold() { umnt; drop_caches; mnt "$1" "$2"; }
LIST=$WORK/random.list
(cd "$DATA/K" && find . -type f -print) | sort | awk 'BEGIN { srand(42) } { print rand() "\t" $0 }' \
    | sort -k1,1 | awk 'NR <= 5000' | cut -f2- > "$LIST"
KINDS="sqfs $PACKS"
for i in $(seq "$RUNS"); do
    log "round $i/$RUNS: random reads of K, cold imports from P"
    for k in $KINDS; do
        cold "$k" K
        s=$(now_ns); (cd "$MP" && xargs -a "$LIST" -d '\n' -P 4 -n 50 cat) >/dev/null; e=$(now_ns)
        R[$k,random]+=" $((e - s))"
        cold "$k" P
        s=$(now_ns)
        (cd /tmp && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$MP" "$PYTHON" -c "$IMPORT")
        e=$(now_ns)
        R[$k,import]+=" $((e - s))"
        umnt
    done
done
for k in $KINDS; do
    # shellcheck disable=SC2086
    { R[$k,random]=$(median ${R[$k,random]}); R[$k,import]=$(median ${R[$k,import]}); }
done

# --- lazy import over HTTP -------------------------------------------------------------------
WWW=$WORK/www; mkdir -p "$WWW"
for p in $PACKS; do ln "$WORK/P-${p/@/-z}.sheaf" "$WWW/P-${p/@/-z}.sheaf"; done
start_nginx
for p in $PACKS; do
    log "lazy import over HTTP, --pack-size $p"
    cache=$(mktemp -d "$WORK/cache.XXXXXX")
    drop_caches
    "$SHEAF" --cache-dir "$cache" mount "$BASE/P-${p/@/-z}.sheaf" "$MP"; CUR=$p
    (cd /tmp && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$MP" "$PYTHON" -c "$LAZY_IMPORT")
    sleep 1   # background readahead settles
    R[$p,http]=$("$SHEAF" stats --json "$MP" | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["remote"]["http_bytes"])')
    umnt; rm -rf "$cache"
done

# --- report ----------------------------------------------------------------------------------
{
    echo "# Default image: pack size decision, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "Machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r); load at end $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "sheaf $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- crates 2>/dev/null || echo ' (+ uncommitted changes)'); $(mksquashfs -version 2>&1 | head -1)."
    echo "sheaf images: zstd:12 unless named, 4 MiB blocks, small files and tails packed into blocks of the pack size (files and tails of a pack or more in blocks of their own), a trained dictionary for the packs unless --no-dict. squashfs: \`mksquashfs -comp zstd\` (level 15, 128 KiB blocks)."
    echo "Random = 5000 files of K (seeded choice) read by \`xargs -P 4 -n 50 cat\`; import = \`$IMPORT\` from P;"
    echo "both on a fresh mount after drop_caches, median of $RUNS interleaved rounds. Builds: one each, page cache dropped before."
    echo "HTTP = \`$LAZY_IMPORT\` from a mount of the image's URL (nginx on 127.0.0.1, empty node cache): remote.http_bytes / image size."
    echo
    echo "| image | K MB (× sqfs) | P MB (× sqfs) | build K s (× mksquashfs) | build P s (×) | K random s (× kernel) | P import s (× kernel) | lazy import fetched |"
    echo "|---|---|---|---|---|---|---|---|"
    echo "| squashfs zstd (kernel) | $(mb "${R[sqfs,K,size]}") | $(mb "${R[sqfs,P,size]}") | $(secs "${R[sqfs,K,build]}") | $(secs "${R[sqfs,P,build]}") | $(secs "${R[sqfs,random]}") | $(secs "${R[sqfs,import]}") | — |"
    for p in $PACKS; do
        echo "| sheaf --pack-size $(size_of "$p") -c zstd:$(level "$p") $(dict_flag "$p") | $(mb "${R[$p,K,size]}") ($(ratio "${R[$p,K,size]}" "${R[sqfs,K,size]}")) | $(mb "${R[$p,P,size]}") ($(ratio "${R[$p,P,size]}" "${R[sqfs,P,size]}")) | $(secs "${R[$p,K,build]}") ($(ratio "${R[$p,K,build]}" "${R[sqfs,K,build]}")) | $(secs "${R[$p,P,build]}") ($(ratio "${R[$p,P,build]}" "${R[sqfs,P,build]}")) | $(secs "${R[$p,random]}") ($(ratio "${R[$p,random]}" "${R[sqfs,random]}")) | $(secs "${R[$p,import]}") ($(ratio "${R[$p,import]}" "${R[sqfs,import]}")) | $(awk -v a="${R[$p,http]}" -v b="${R[$p,P,size]}" 'BEGIN { printf "%.1f%%", 100 * a / b }') |"
    done
    echo
    echo "## Targets per candidate"
    echo
    echo "| image | size K ≤ 0.95 | size P ≤ 0.95 | build ≤ 0.5 (K, P) | random ≤ 0.5 | import ≤ 1.1 | lazy ≤ 15% |"
    echo "|---|---|---|---|---|---|---|"
    for p in $PACKS; do
        sk=$(ratio "${R[$p,K,size]}" "${R[sqfs,K,size]}"); sp=$(ratio "${R[$p,P,size]}" "${R[sqfs,P,size]}")
        bk=$(ratio "${R[$p,K,build]}" "${R[sqfs,K,build]}"); bp=$(ratio "${R[$p,P,build]}" "${R[sqfs,P,build]}")
        rr=$(ratio "${R[$p,random]}" "${R[sqfs,random]}"); ii=$(ratio "${R[$p,import]}" "${R[sqfs,import]}")
        hh=$(awk -v a="${R[$p,http]}" -v b="${R[$p,P,size]}" 'BEGIN { printf "%.1f", 100 * a / b }')
        bb=$(awk -v a="$bk" -v b="$bp" 'BEGIN { print (a > b) ? a : b }')
        echo "| $p | $(verdict "$sk" 0.95) | $(verdict "$sp" 0.95) | $(verdict "$bb" 0.5) | $(verdict "$rr" 0.5) | $(verdict "$ii" 1.1) | $(verdict "$hh" 15) |"
    done
} > "$OUT"
cat "$OUT"
log "wrote $OUT"
