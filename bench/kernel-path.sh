#!/usr/bin/env bash
# The kernel path (issue 55): `sheaf mount --kernel` (EROFS metadata in the
# kernel, data from sheaf's blob) against the kernel's squashfs and sheaf's
# FUSE mount, on tree K and on a 1M-entry HCP-like tree (bench/gen-tar.py).
# Every figure on a fresh mount after drop_caches, median of ROUNDS, all
# in this one run:
#   cold find, cold ls -lR (entries/s), warm find (entries/s, second run on
#   the same mount), read-all (tar -cf - . | wc -c, MB/s), 5000 random
#   files of K (s); the first kernel mount of an image (metadata image made
#   during the mount, its time included) against later ones; making the
#   metadata image (entries/s, bytes per entry; crates/sheaf-erofs's
#   erofs-meta example); lazily over HTTP (a real nginx), the bytes an
#   import of numpy/scipy/pandas from tree P fetches into an empty node
#   cache through each mount.
# Writes bench/results/DATE-kernel-path.md.
#
# Usage: bench/kernel-path.sh     (run as root)
# Env:   ROUNDS (default 3), COLD_ENTRIES (default 1000000),
#        SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench), PYTHON
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=$ROOT/target/release/sheaf
META=$ROOT/target/release/examples/erofs-meta
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
PYTHON=${PYTHON:-/usr/bin/python3}
ROUNDS=${ROUNDS:-3}
N=${COLD_ENTRIES:-1000000}
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-kernel-path.md
die() { echo "kernel-path: $*" >&2; exit 1; }
log() { echo "kernel-path: $*" >&2; }

[ "$(id -u)" = 0 ] || die "run as root (drop_caches, kernel mounts)"
[ -x "$SHEAF" ] || die "$SHEAF missing (make build)"
[ -d "$DATA/K" ] || die "$DATA/K missing (bench/setup.sh K)"
[ -d "$DATA/P" ] || die "$DATA/P missing (bench/setup.sh P)"
for c in mksquashfs tar2sqfs nginx curl; do
    command -v $c >/dev/null || die "$c missing (scripts/deps.sh bench)"
done
cargo build --release --locked -q -p sheaf-erofs --example erofs-meta --manifest-path "$ROOT/Cargo.toml"

WORK=$(mktemp -d "$DATA/kernel-path.XXXXXX")
MP=$(mktemp -d /tmp/sheaf-bench-kernel.XXXXXX)
KC=$WORK/kcache
CUR=""
umount_any() {
    case $CUR in
        sheaf*) "$SHEAF" umount "$MP" ;;
        "") ;;
        *) umount "$MP" ;;
    esac
    CUR=""
    # A kernel-path server ends with its mount; wait for it, so that the
    # next round's drop_caches finds it gone.
    while pgrep -f "sheaf mount .* $MP" >/dev/null; do sleep 0.01; done
}
WWW=$WORK/www
mkdir -p "$WWW"
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
trap 'umount_any 2>/dev/null || true; [ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null; rm -rf "$WORK"; rmdir "$MP" 2>/dev/null || true' EXIT

log "images of K and of a ${N}-entry HCP-like stream"
"$SHEAF" build -q "$DATA/K" -o "$WORK/K.sheaf"
mksquashfs "$DATA/K" "$WORK/K.sqfs" -noappend -comp zstd -quiet -no-progress >/dev/null
"$PYTHON" "$ROOT/bench/gen-tar.py" "$N" | "$SHEAF" build -q - -o "$WORK/H.sheaf"
"$PYTHON" "$ROOT/bench/gen-tar.py" "$N" | tar2sqfs -q -f -c zstd "$WORK/H.sqfs" >/dev/null

mount_as() { # KIND TREE
    case $1 in
        squashfs) mount -t squashfs -o loop,ro "$WORK/$2.sqfs" "$MP" ;;
        sheaf) "$SHEAF" mount "$WORK/$2.sheaf" "$MP" ;;
        sheaf-kernel) "$SHEAF" mount --kernel=require -o "kernel_cache=$KC" "$WORK/$2.sheaf" "$MP" ;;
        # The first mount of the image: its metadata image is made during the mount.
        sheaf-first) rm -rf "$KC"; "$SHEAF" mount --kernel=require -o "kernel_cache=$KC" "$WORK/$2.sheaf" "$MP" ;;
    esac
    CUR=$1
}
now_ns() { date +%s%N; }
median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
fresh() { umount_any; sync; echo 3 > /proc/sys/vm/drop_caches; }

# rate KIND TREE CMD [warm]: median entries/s of CMD (output lines counted),
# the mount's time included for sheaf-first.
rate() {
    local kind=$1 tree=$2 cmd=$3 r rates="" n s e
    for r in $(seq "$ROUNDS"); do
        fresh
        s=$(now_ns); mount_as "$kind" "$tree"
        [ "$kind" = sheaf-first ] || s=$(now_ns)
        if [ "${4:-}" = warm ]; then (cd "$MP" && eval "$cmd" >/dev/null); s=$(now_ns); fi
        n=$(cd "$MP" && eval "$cmd" | wc -l); e=$(now_ns)
        rates="$rates $(( n * 1000000000 / (e - s) ))"
    done
    umount_any
    echo "$rates" | median
}
# secs KIND TREE CMD: median seconds (ns) of CMD on a fresh mount.
secs() {
    local kind=$1 tree=$2 cmd=$3 r v="" s e
    for r in $(seq "$ROUNDS"); do
        fresh; mount_as "$kind" "$tree"
        s=$(now_ns); (cd "$MP" && eval "$cmd") >/dev/null; e=$(now_ns)
        v="$v $((e - s))"
    done
    umount_any
    echo "$v" | median
}

LIST=$(mktemp)
(cd "$DATA/K" && find . -type f -print) | sort | awk 'BEGIN { srand(42) } { print rand() "\t" $0 }' \
    | sort -k1,1 | awk 'NR <= 5000' | cut -f2- > "$LIST"
K_BYTES=$(du -sb --apparent-size "$DATA/K" | cut -f1)

# Prime the metadata cache for sheaf-kernel.
for tree in K H; do mount_as sheaf-kernel $tree; umount_any; done

declare -A R
for tree in K H; do
    for kind in squashfs sheaf sheaf-kernel sheaf-first; do
        log "$tree $kind: find, ls -lR"
        R[$tree,$kind,find]=$(rate "$kind" "$tree" "find .")
        [ $kind = sheaf-first ] && continue
        R[$tree,$kind,ls]=$(rate "$kind" "$tree" "ls -lR .")
        R[$tree,$kind,warm]=$(rate "$kind" "$tree" "find ." warm)
    done
    mount_as sheaf-kernel $tree; umount_any
done
for kind in squashfs sheaf sheaf-kernel; do
    log "K $kind: read-all, random"
    R[K,$kind,tar]=$(secs "$kind" K "tar -cf - . | wc -c")
    R[K,$kind,random]=$(secs "$kind" K "xargs -a '$LIST' -d '\n' -P 4 -n 50 cat")
done
log "P over HTTP: the bytes an import fetches"
"$SHEAF" build -q "$DATA/P" -o "$WWW/P.sheaf"
start_nginx
IMPORT="import numpy, scipy.linalg, pandas"
declare -A F
for kind in sheaf sheaf-kernel; do
    fresh
    cache=$WORK/nc-$kind
    rm -rf "$cache"
    if [ $kind = sheaf ]; then
        "$SHEAF" --cache-dir "$cache" mount "$BASE/P.sheaf" "$MP"
    else
        "$SHEAF" --cache-dir "$cache" mount --kernel=require -o "kernel_cache=$WORK/kc-http" "$BASE/P.sheaf" "$MP"
    fi
    CUR=$kind
    (cd /tmp && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$MP" "$PYTHON" -c "$IMPORT")
    # Background fetches (the FUSE mount's metadata prefetch) end first.
    prev=-1; cur=$(du -sb "$cache" | cut -f1)
    while [ "$cur" != "$prev" ]; do sleep 1; prev=$cur; cur=$(du -sb "$cache" | cut -f1); done
    F[$kind]=$cur
    umount_any
done

declare -A M
for tree in K H; do
    out=$("$META" "$WORK/$tree.sheaf" "$WORK/$tree.meta" 2>&1 >/dev/null | tail -1)
    M[$tree,rate]=$(echo "$out" | sed -n 's/.* s (\([0-9]*\) entries\/s).*/\1/p')
    M[$tree,bpe]=$(echo "$out" | sed -n 's/.*bytes (\([0-9.]*\) B\/entry).*/\1/p')
    M[$tree,bytes]=$(stat -c %s "$WORK/$tree.meta")
done

k() { if [ -n "$1" ]; then echo "$(( $1 / 1000 ))K"; else echo "—"; fi; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
s() { awk -v a="$1" 'BEGIN { printf "%.2f", a / 1e9 }'; }
mbs() { awk -v b="$K_BYTES" -v t="$1" 'BEGIN { printf "%.0f", b / 1e6 / (t / 1e9) }'; }
ok() { awk -v x="$1" -v t="$3" -v op="$2" 'BEGIN { print ((op == "ge" ? x >= t : x <= t) ? "met" : "**not met**") }'; }
{
    echo "# The kernel path: sheaf mount --kernel against kernel squashfs and sheaf's FUSE mount"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M') UTC, $(nproc) cores, kernel $(uname -r);" \
        "sheaf $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- crates vendor 2>/dev/null || echo ' (+ uncommitted changes)')."
    echo "Fresh mount after drop_caches for every figure, median of $ROUNDS, all in this run."
    echo "K: Linux source tree ($(find "$DATA/K" | wc -l) entries); H: bench/gen-tar.py $N (HCP-like, small directories)."
    echo "sheaf-kernel: metadata image already made (a later mount); first: the first mount, making it included."
    echo
    echo "| tree | test | squashfs (kernel) | sheaf FUSE | sheaf --kernel | --kernel, first mount | --kernel / squashfs | first / squashfs | --kernel / FUSE |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for tree in K H; do
        for t in find ls warm; do
            name=$( case $t in find) echo "cold find (entries/s)";; ls) echo "cold ls -lR (entries/s)";; warm) echo "warm find (entries/s)";; esac )
            first=—; fr=—
            if [ $t = find ]; then first=$(k "${R[$tree,sheaf-first,find]}"); fr=$(ratio "${R[$tree,sheaf-first,find]}" "${R[$tree,squashfs,find]}"); fi
            echo "| $tree | $name | $(k "${R[$tree,squashfs,$t]}") | $(k "${R[$tree,sheaf,$t]}") | $(k "${R[$tree,sheaf-kernel,$t]}") | $first | $(ratio "${R[$tree,sheaf-kernel,$t]}" "${R[$tree,squashfs,$t]}") | $fr | $(ratio "${R[$tree,sheaf-kernel,$t]}" "${R[$tree,sheaf,$t]}") |"
        done
    done
    echo "| K | read-all (MB/s) | $(mbs "${R[K,squashfs,tar]}") | $(mbs "${R[K,sheaf,tar]}") | $(mbs "${R[K,sheaf-kernel,tar]}") | — | $(ratio "${R[K,squashfs,tar]}" "${R[K,sheaf-kernel,tar]}") | — | $(ratio "${R[K,sheaf,tar]}" "${R[K,sheaf-kernel,tar]}") |"
    echo "| K | 5000 random files (s) | $(s "${R[K,squashfs,random]}") | $(s "${R[K,sheaf,random]}") | $(s "${R[K,sheaf-kernel,random]}") | — | $(ratio "${R[K,sheaf-kernel,random]}" "${R[K,squashfs,random]}") (time) | — | $(ratio "${R[K,sheaf-kernel,random]}" "${R[K,sheaf,random]}") (time) |"
    echo
    echo "Making the metadata image (erofs-meta, from the local image, page cache warm):"
    echo
    echo "| tree | entries/s | bytes | bytes per inode |"
    echo "|---|---|---|---|"
    for tree in K H; do echo "| $tree | $(k "${M[$tree,rate]}") | ${M[$tree,bytes]} | ${M[$tree,bpe]} |"; done
    echo
    echo "## Targets"
    echo
    echo "| target | K | H |"
    echo "|---|---|---|"
    for tree in K H; do x=$(ratio "${R[$tree,sheaf-kernel,find]}" "${R[$tree,squashfs,find]}"); eval "cf_$tree=\"$x (\$(ok $x ge 2))\""; done
    echo "| cold find ≥ 2× kernel squashfs (metadata image made) | $cf_K | $cf_H |"
    for tree in K H; do x=$(ratio "${R[$tree,sheaf-first,find]}" "${R[$tree,squashfs,find]}"); eval "ff_$tree=\"$x (\$(ok $x ge 1))\""; done
    echo "| cold find ≥ 1× on the first mount, making it included | $ff_K | $ff_H |"
    for tree in K H; do x=$(ratio "${R[$tree,sheaf-kernel,warm]}" "${R[$tree,squashfs,warm]}"); eval "wf_$tree=\"$x (\$(ok $x ge 1.5))\""; done
    echo "| warm find ≥ 1.5× kernel squashfs | $wf_K | $wf_H |"
    for tree in K H; do x=$(ratio "${R[$tree,sheaf-kernel,ls]}" "${R[$tree,squashfs,ls]}"); eval "ls_$tree=\"$x (\$(ok $x ge 1))\""; done
    echo "| cold ls -lR ≥ 1× kernel squashfs (rate) | $ls_K | $ls_H |"
    x=$(ratio "${R[K,squashfs,tar]}" "${R[K,sheaf-kernel,tar]}"); echo "| read-all ≥ 1× kernel squashfs throughput | $x ($(ok $x ge 1)) | — |"
    x=$(ratio "${R[K,sheaf,tar]}" "${R[K,sheaf-kernel,tar]}"); echo "| read-all within 10% of sheaf's FUSE mount | $x ($(ok $x ge 0.9)) | — |"
    x=$(ratio "${R[K,sheaf-kernel,random]}" "${R[K,squashfs,random]}"); echo "| 5000 random files ≤ 0.5× kernel squashfs time | $x ($(ok $x le 0.5)) | — |"
    for tree in K H; do x=${M[$tree,rate]}; eval "mr_$tree=\"$(k "$x")/s (\$(ok $x ge 1000000))\""; done
    echo "| making the metadata image ≥ 1M entries/s | $mr_K | $mr_H |"
    x=${M[H,bpe]}; echo "| ≤ 100 B per entry on disk for the 1M tree | — | $x ($(ok "$x" le 100)) |"
    x=$(ratio "${F[sheaf-kernel]}" "${F[sheaf]}")
    echo "| lazy over HTTP: P's import fetches ≤ the FUSE mount's (±5%) | $(awk -v b="${F[sheaf-kernel]}" 'BEGIN { printf "%.1f", b / 1e6 }') MB against $(awk -v b="${F[sheaf]}" 'BEGIN { printf "%.1f", b / 1e6 }') MB: $x ($(ok "$x" le 1.05)) | — |"
} | tee "$OUT"
log "wrote $OUT"
