#!/usr/bin/env bash
# Mounted-image benchmark (issue 3): sheaf mount against the kernel's squashfs and
# erofs (loop mounts, root only) and squashfuse_ll (the unprivileged peer), on the
# same trees, in the same run. Writes bench/results/DATE-mount.md.
#
# Tree K: cold and warm `find | wc -l`, cold `tar -cf - . | wc -c`, 5000 random files
# read by 4 parallel cat, mount time (median of 5), peak RSS of the serving process.
# Tree P: cold and warm import of the scientific stack with PYTHONPATH on the mount.
# "Cold" = freshly mounted (a new serving process) after dropping the page cache.
#
# Usage: bench/mount.sh            (after bench/setup.sh K P; run as root)
# Env:   SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench), MOUNTS (subset of
#        "sqfs-kernel squashfuse_ll erofs-kernel sheaf"), PYTHON (default python3)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
IMAGES=$DATA/images
MOUNTS=${MOUNTS:-"sqfs-kernel squashfuse_ll erofs-kernel sheaf sheaf-p128k"}
SHEAF_OPTS=${SHEAF_OPTS:-}   # extra -o options for sheaf mount (experiments)
PYTHON=${PYTHON:-python3}
IMPORT="import numpy, scipy.linalg, scipy.sparse, pandas, sklearn.ensemble, matplotlib.pyplot, sympy, h5py, networkx"
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-mount.md
MP=$(mktemp -d /tmp/sheaf-bench-mnt.XXXXXX)

log() { printf '[mount-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (loop mounts, drop_caches)"
[ -x "$SHEAF" ] || die "$SHEAF missing: run make build"
for t in K P; do [ -d "$DATA/$t" ] || die "$DATA/$t missing: run bench/setup.sh K P"; done
command -v squashfuse_ll >/dev/null || die "squashfuse_ll missing (apt-get install squashfuse)"
mkdir -p "$IMAGES"

cleanup() { umount_any 2>/dev/null || true; rmdir "$MP" 2>/dev/null || true; }
trap cleanup EXIT

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now_ns() { date +%s%N; }
secs() { awk -v n="$1" 'BEGIN { printf "%.3f", n / 1e9 }'; }
calc() { local f=$1 e=$2; shift 2; awk -v f="$f" "BEGIN { a=$1; b=${2:-0}; printf f, $e }"; }

# --- images (anchor images are cached; sheaf images are rebuilt every run) ---------------
image() { # image KIND TREE -> path
    local kind=$1 t=$2 img
    case $kind in
        sqfs)  img=$IMAGES/$t.sqfs ;;
        erofs) img=$IMAGES/$t.erofs ;;
        sheaf) img=$IMAGES/$t.sheaf ;;
        sheaf-p128k) img=$IMAGES/$t-p128k.sheaf ;;
    esac
    if { [ "$kind" = sheaf-p128k ] && [ "${REBUILD_SHEAF:-1}" = 1 ]; } || { [ "$kind" = sheaf ] && [ "${REBUILD_SHEAF:-1}" = 1 ]; } || [ ! -f "$img" ]; then
        log "building $kind image of $t"
        rm -f "$img"
        case $kind in
            sqfs)  mksquashfs "$DATA/$t" "$img.tmp" -noappend -comp zstd -quiet -no-progress >/dev/null && mv "$img.tmp" "$img" ;;
            erofs) mkfs.erofs -zlz4hc "$img.tmp" "$DATA/$t" >/dev/null && mv "$img.tmp" "$img" ;;
            sheaf) "$SHEAF" build -q "$DATA/$t" -o "$img" ;;
            sheaf-p128k) "$SHEAF" build -q --pack-size 128K "$DATA/$t" -o "$img" ;;
        esac
    fi
    echo "$img"
}

# --- mount / unmount --------------------------------------------------------------------
CUR=""
mount_as() { # mount_as KIND TREE
    local kind=$1 t=$2
    case $kind in
        sqfs-kernel)   mount -t squashfs -o loop,ro "$(image sqfs "$t")" "$MP" ;;
        squashfuse_ll) squashfuse_ll "$(image sqfs "$t")" "$MP" ;;
        erofs-kernel)  mount -t erofs -o loop,ro "$(image erofs "$t")" "$MP" ;;
        sheaf)         "$SHEAF" mount ${SHEAF_OPTS:+-o "$SHEAF_OPTS"} "$(image sheaf "$t")" "$MP" ;;
        sheaf-p128k)   "$SHEAF" mount ${SHEAF_OPTS:+-o "$SHEAF_OPTS"} "$(image sheaf-p128k "$t")" "$MP" ;;
    esac
    CUR=$kind
}
umount_any() {
    case $CUR in
        sheaf|sheaf-p128k) "$SHEAF" umount "$MP" ;;
        "") ;;
        *) umount "$MP" ;;
    esac
    CUR=""
}
server_pid() {
    case $CUR in
        sheaf|sheaf-p128k) server_pid "sheaf mount .* $MP\$" ;;
        squashfuse_ll) pgrep -f "squashfuse_ll .* $MP\$" | head -1 ;;
        *) echo "" ;;
    esac
}
peak_rss_kib() { # of the serving process, if there is one
    local pid; pid=$(server_pid)
    [ -n "$pid" ] && awk '/VmHWM/ { print $2 }' "/proc/$pid/status" || echo "-"
}
# Time a command run in the mount (ns); output discarded.
timed() { local s e; s=$(now_ns); ( cd "$MP" && eval "$1" ) >/dev/null; e=$(now_ns); echo $((e - s)); }
cold() { umount_any; drop_caches; mount_as "$1" "$2"; }

declare -A R
# Mount time: make sure images exist first, then the median of 5 cycles.
mount_time() { # KIND [cold]
    local k=$1 i s e v=()
    for i in 1 2 3 4 5; do
        [ "${2:-}" = cold ] && drop_caches
        s=$(now_ns); mount_as "$k" K; e=$(now_ns)
        ls "$MP" >/dev/null
        v+=($(( (e - s) / 1000 )))
        umount_any
    done
    printf '%s\n' "${v[@]}" | sort -n | sed -n 3p
}

for k in $MOUNTS; do
    case $k in sqfs-kernel|squashfuse_ll) image sqfs K >/dev/null; image sqfs P >/dev/null ;;
               erofs-kernel) image erofs K >/dev/null ;;
               sheaf) image sheaf K >/dev/null; image sheaf P >/dev/null ;;
               sheaf-p128k) image sheaf-p128k K >/dev/null; image sheaf-p128k P >/dev/null ;; esac
done
# Images exist now; from here on just name them.
image() { # cached from here on
    local kind=$1 t=$2
    case $kind in sqfs) echo "$IMAGES/$t.sqfs" ;; erofs) echo "$IMAGES/$t.erofs" ;; sheaf) echo "$IMAGES/$t.sheaf" ;;
                  sheaf-p128k) echo "$IMAGES/$t-p128k.sheaf" ;; esac
}

# The same 5000 files for everyone.
LIST=$(mktemp)
(cd "$DATA/K" && find . -type f -print) | sort | awk 'BEGIN { srand(42) } { print rand() "\t" $0 }' \
    | sort -k1,1 | awk 'NR <= 5000' | cut -f2- > "$LIST"

for k in $MOUNTS; do
    log "$k: mount time"
    R[$k,mount_us]=$(mount_time "$k")
    R[$k,mount_cold_us]=$(mount_time "$k" cold)
    log "$k: tree K"
    cold "$k" K
    R[$k,entries]=$(cd "$MP" && find . | wc -l)
    umount_any; drop_caches; mount_as "$k" K
    R[$k,find_cold]=$(timed "find . | wc -l")
    R[$k,find_warm]=$(timed "find . | wc -l")
    cold "$k" K
    s=$(now_ns); bytes=$(cd "$MP" && tar -cf - . | wc -c); e=$(now_ns)
    R[$k,tar_ns]=$((e - s)); R[$k,tar_bytes]=$bytes
    R[$k,rss_tar]=$(peak_rss_kib)
    cold "$k" K
    R[$k,random]=$(timed "xargs -a '$LIST' -d '\n' -P 4 -n 50 cat")
    R[$k,rss]=$(peak_rss_kib)
    umount_any
    if [ "$k" != erofs-kernel ]; then
        log "$k: tree P imports"
        cold "$k" P
        R[$k,imp_cold]=$(timed "cd /tmp && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH='$MP' $PYTHON -c '$IMPORT'")
        R[$k,imp_warm]=$(timed "cd /tmp && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH='$MP' $PYTHON -c '$IMPORT'")
        umount_any
    fi
done
rm -f "$LIST"

# --- report -----------------------------------------------------------------------------
g() { echo "${R[$1]:-}"; }
rate() { calc '%.0f' 'a/(b/1e9)/1000' "$(g "$1,entries")" "$(g "$1,$2")"; }   # K entries/s
mbs() { calc '%.0f' 'a/(b/1e9)/1e6' "$(g "$1,tar_bytes")" "$(g "$1,tar_ns")"; }
{
    echo "# sheaf mount benchmark, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "Machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2/1048576 }' /proc/meminfo), kernel $(uname -r)."
    echo "sheaf $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'); squashfuse $(dpkg-query -W -f='${Version}' squashfuse 2>/dev/null);"
    echo "images: squashfs zstd (mksquashfs default level), erofs lz4hc, sheaf default (zstd:12, 4 MiB blocks),"
    echo "sheaf-p128k (the same with --pack-size 128K: small files in 128 KiB blocks)."
    echo
    echo "Image sizes (K / P, MB): $(for k in sqfs erofs sheaf sheaf-p128k; do for t in K P; do f=$(image $k $t); [ -f "$f" ] && printf '%s %s %.1f; ' "$k" "$t" "$(stat -c %s "$f" | awk '{ print $1/1e6 }')"; done; done)"
    echo "Cold = fresh mount after dropping the page cache; one run each; times in seconds.${SHEAF_OPTS:+ sheaf -o $SHEAF_OPTS.}"
    echo
    echo "| mount | mount ms (median of 5; warm / page cache dropped) | K cold find (K entries/s) | K warm find | K read-all MB/s | K random 5000 s | peak RSS MiB (read-all / random) | P import cold s | P import warm s |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for k in $MOUNTS; do
        rss=$(g "$k,rss_tar"); [ "$rss" = "-" ] || rss="$(calc '%.0f' 'a/1024' "$rss") / $(calc '%.0f' 'a/1024' "$(g "$k,rss")")"
        echo "| $k | $(calc '%.1f' a/1000 "$(g "$k,mount_us")") / $(calc '%.1f' a/1000 "$(g "$k,mount_cold_us")") | $(rate "$k" find_cold) | $(rate "$k" find_warm) | $(mbs "$k") | $(secs "$(g "$k,random")") | $rss | $( [ -n "$(g "$k,imp_cold")" ] && secs "$(g "$k,imp_cold")" || echo —) | $( [ -n "$(g "$k,imp_warm")" ] && secs "$(g "$k,imp_warm")" || echo —) |"
    done
    if [[ " $MOUNTS " == *" sheaf "* && " $MOUNTS " == *" sqfs-kernel "* ]]; then
        echo
        echo "## Targets (sheaf against kernel squashfs, same run)"
        echo
        r() { calc '%.2f' "$1" "$2" "$3"; }
        s=sheaf; q=sqfs-kernel
        echo "| target | ratio | verdict |"
        echo "|---|---|---|"
        v() { awk -v x="$1" -v t="$3" -v op="$2" 'BEGIN { ok = (op == "ge") ? x >= t : x <= t; print ok ? "met" : "MISSED" }'; }
        x=$(r 'b/a' "$(g $s,find_warm)" "$(g $q,find_warm)"); echo "| warm find ≥ 1.0× kernel squashfs entries/s | $x | $(v "$x" ge 1.0) |"
        x=$(r 'b/a' "$(g $s,find_cold)" "$(g $q,find_cold)"); echo "| cold find ≥ 0.5× kernel squashfs | $x | $(v "$x" ge 0.5) |"
        if [[ " $MOUNTS " == *" squashfuse_ll "* ]]; then
            x=$(r 'b/a' "$(g $s,find_cold)" "$(g squashfuse_ll,find_cold)"); echo "| cold find ≥ 3× squashfuse_ll | $x | $(v "$x" ge 3) |"
        fi
        x=$(calc '%.2f' '(a/b)' "$(mbs $s)" "$(mbs $q)"); echo "| cold read-all ≥ 0.9× kernel squashfs throughput | $x | $(v "$x" ge 0.9) |"
        x=$(r 'a/b' "$(g $s,random)" "$(g $q,random)"); echo "| 5000 random files ≤ 0.5× kernel squashfs time | $x | $(v "$x" le 0.5) |"
        if [[ " $MOUNTS " == *" sheaf-p128k "* ]]; then
            x=$(r 'a/b' "$(g sheaf-p128k,random)" "$(g $q,random)"); echo "| the same, image built with --pack-size 128K | $x | $(v "$x" le 0.5) |"
        fi
        x=$(r 'a/b' "$(g $s,imp_cold)" "$(g $q,imp_cold)"); echo "| Python import cold ≤ 1.1× kernel squashfs time | $x | $(v "$x" le 1.1) |"
        x=$(calc '%.1f' a/1000 "$(g $s,mount_us)"); echo "| mount ready ≤ 20 ms | $x ms | $(v "$x" le 20) |"
        x=$(calc '%.0f' a/1024 "$(g $s,rss_tar)"); echo "| mount process peak RSS (read-all) ≤ 64 MiB + block cache (256 MiB default) | $x MiB | $(v "$x" le 320) |"
    fi
} > "$OUT"
cat "$OUT"
log "wrote $OUT"
