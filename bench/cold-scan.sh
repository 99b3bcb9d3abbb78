#!/usr/bin/env bash
# Cold scans (issue 15 §2): `find` and `ls -lR` on a fresh mount after
# drop_caches, entries per second, median of ROUNDS, on tree K and on a
# 1M-entry HCP-like tree (bench/gen-tar.py, built by sheaf from the stream and
# by tar2sqfs for the squashfs mounts). Mounts: kernel squashfs (zstd),
# squashfuse_ll, sheaf (default listing policy) and sheaf with
# `readdirplus=always` (every file listed with attributes, the policy before
# 2026-11-24) and sheaf over FUSE io_uring (the `fuse` module's enable_uring
# switched on for those mounts, then restored). Targets: cold `find` ≥ 0.5× kernel and ≥ 2× squashfuse_ll.
# Writes bench/results/DATE-cold-scan.md.
#
# Usage: bench/cold-scan.sh     (run as root)
# Env:   ROUNDS (default 3), COLD_ENTRIES (default 1000000),
#        SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench), PYTHON
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=$ROOT/target/release/sheaf
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
PYTHON=${PYTHON:-/usr/bin/python3}
ROUNDS=${ROUNDS:-3}
N=${COLD_ENTRIES:-1000000}
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-cold-scan.md
die() { echo "cold-scan: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (drop_caches, loop mounts)"
[ -x "$SHEAF" ] || die "$SHEAF missing (make build)"
[ -d "$DATA/K" ] || die "$DATA/K missing (bench/setup.sh K)"
for c in mksquashfs tar2sqfs squashfuse_ll; do
    command -v $c >/dev/null || die "$c missing (scripts/deps.sh bench)"
done

WORK=$(mktemp -d "$DATA/cold-scan.XXXXXX")
MP=$(mktemp -d /tmp/sheaf-bench-cold.XXXXXX)
CUR=""
umount_any() {
    case $CUR in
        sheaf*) "$SHEAF" umount "$MP" ;;
        "") ;;
        *) umount "$MP" ;;
    esac
    CUR=""
}
URING=/sys/module/fuse/parameters/enable_uring
URING_WAS=$(cat "$URING" 2>/dev/null || true)
uring() { [ -n "$URING_WAS" ] && echo "$1" > "$URING"; }
trap 'umount_any 2>/dev/null || true; uring "$URING_WAS" 2>/dev/null || true; rm -rf "$WORK"; rmdir "$MP" 2>/dev/null || true' EXIT

echo "cold-scan: images of K and of a ${N}-entry HCP-like stream" >&2
"$SHEAF" build -q "$DATA/K" -o "$WORK/K.sheaf"
mksquashfs "$DATA/K" "$WORK/K.sqfs" -noappend -comp zstd -quiet -no-progress >/dev/null
"$PYTHON" "$ROOT/bench/gen-tar.py" "$N" | "$SHEAF" build -q - -o "$WORK/H.sheaf"
"$PYTHON" "$ROOT/bench/gen-tar.py" "$N" | tar2sqfs -q -f -c zstd "$WORK/H.sqfs" >/dev/null

mount_as() { # KIND TREE
    case $1 in
        kernel) mount -t squashfs -o loop,ro "$WORK/$2.sqfs" "$MP" ;;
        squashfuse_ll) squashfuse_ll "$WORK/$2.sqfs" "$MP" ;;
        sheaf) "$SHEAF" mount "$WORK/$2.sheaf" "$MP" ;;
        sheaf-always) "$SHEAF" mount -o readdirplus=always "$WORK/$2.sheaf" "$MP" ;;
        # The switch is read when the kernel sends INIT, so it is back
        # to its old value right after the mount.
        sheaf-uring) uring Y; "$SHEAF" mount -o io_uring=auto "$WORK/$2.sheaf" "$MP"; uring "$URING_WAS" ;;
    esac
    CUR=$1
}
now_ns() { date +%s%N; }
median() { tr ' ' '\n' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# rate KIND TREE CMD: median entries/s of CMD (its output lines are counted).
rate() {
    local kind=$1 tree=$2 cmd=$3 r rates="" n s e
    for r in $(seq "$ROUNDS"); do
        umount_any
        sync; echo 3 > /proc/sys/vm/drop_caches
        mount_as "$kind" "$tree"
        s=$(now_ns); n=$(cd "$MP" && eval "$cmd" | wc -l); e=$(now_ns)
        rates="$rates $(( n * 1000000000 / (e - s) ))"
    done
    umount_any
    echo "$rates" | median
}

KINDS="kernel squashfuse_ll sheaf sheaf-always"
[ -n "$URING_WAS" ] && KINDS="$KINDS sheaf-uring"
declare -A R
for tree in K H; do
    for kind in $KINDS; do
        echo "cold-scan: $tree $kind" >&2
        R[$tree,$kind,find]=$(rate "$kind" "$tree" "find .")
        R[$tree,$kind,ls]=$(rate "$kind" "$tree" "ls -lR .")
    done
done

k() { if [ -n "$1" ]; then echo "$(( $1 / 1000 ))K"; else echo "—"; fi; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
{
    echo "# Cold scans: kernel squashfs, squashfuse_ll, sheaf"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M') UTC, $(nproc) cores, kernel $(uname -r);" \
        "sheaf $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- crates vendor 2>/dev/null || echo ' (+ uncommitted changes)');" \
        "squashfuse $(dpkg-query -W -f '${Version}' squashfuse 2>/dev/null)."
    echo "Entries per second, fresh mount after drop_caches, median of $ROUNDS."
    echo "K: Linux source tree ($(find "$DATA/K" | wc -l) entries); H: bench/gen-tar.py $N (HCP-like)."
    echo
    echo "| tree | tool | kernel squashfs | squashfuse_ll | sheaf | sheaf readdirplus=always | sheaf io_uring | sheaf / kernel | sheaf / squashfuse_ll | io_uring / squashfuse_ll |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for tree in K H; do
        for t in find ls; do
            echo "| $tree | $( [ $t = ls ] && echo 'ls -lR' || echo find ) | $(k "${R[$tree,kernel,$t]}") | $(k "${R[$tree,squashfuse_ll,$t]}") | $(k "${R[$tree,sheaf,$t]}") | $(k "${R[$tree,sheaf-always,$t]}") | $(k "${R[$tree,sheaf-uring,$t]:-}") | $(ratio "${R[$tree,sheaf,$t]}" "${R[$tree,kernel,$t]}") | $(ratio "${R[$tree,sheaf,$t]}" "${R[$tree,squashfuse_ll,$t]}") | $( [ -n "${R[$tree,sheaf-uring,$t]:-}" ] && ratio "${R[$tree,sheaf-uring,$t]}" "${R[$tree,squashfuse_ll,$t]}" || echo "—") |"
        done
    done
    echo
    echo "Targets (issue 15): cold find ≥ 0.5× kernel squashfs and ≥ 2× squashfuse_ll, on K and on the 1M-entry tree."
} | tee "$OUT"
echo "cold-scan: wrote $OUT" >&2
