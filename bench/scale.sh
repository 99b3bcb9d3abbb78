#!/usr/bin/env bash
# HCP scale (issue 15 §4): a 16M-entry image built from a tar stream that
# bench/gen-tar.py generates on the fly (this disk has too few inodes for such
# a directory), against squashfs-tools-ng's tar2sqfs on the same stream; then
# reading it: mount time (warm and after drop_caches, medians of
# SCALE_MOUNT_ROUNDS rounds alternating with the anchor: returned,
# root listed, with ls) against
# squashfuse_ll on the tar2sqfs image, server RSS after a full walk, warm
# `find` rate (kernel squashfs beside it), and `sheaf find` with no mount.
# Builder memory per entry is the slope between a SMALL and the full build:
# (peak RSS_N − peak RSS_SMALL) / (N − SMALL).
# From a directory (tree M, 1M small files, if bench/setup.sh M made it):
# sheaf build against mksquashfs.
# Writes bench/results/DATE-scale.md.
#
# Usage: bench/scale.sh     (run as root)
# Env:   SCALE_ENTRIES (default 16000000), SCALE_SMALL (default 1000000),
#        SCALE_ANCHOR_ENTRIES (default SCALE_ENTRIES: the size of the stream
#        tar2sqfs builds; smaller saves time, about 80 s per 1M entries here),
#        SCALE_MOUNT_ROUNDS (default 15),
#        SCALE_IMAGES=DIR: keep the two images read (hcp-N.sheaf, hcp-AN.sqfs)
#        in DIR, and if both are there already, build nothing and time only
#        the reading (the builder's figures are then left out of the report),
#        SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench), PYTHON
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
N=${SCALE_ENTRIES:-16000000}
SMALL=${SCALE_SMALL:-1000000}
AN=${SCALE_ANCHOR_ENTRIES:-$N}
PYTHON=${PYTHON:-python3}
GEN="$ROOT/bench/gen-tar.py"
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-scale.md

log() { printf '[scale %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (loop mounts, drop_caches)"
[ -x "$SHEAF" ] || die "$SHEAF missing: run make build"
for c in tar2sqfs squashfuse_ll mksquashfs /usr/bin/time; do
    command -v "$c" >/dev/null || die "$c missing (make bench installs squashfs-tools-ng, squashfuse, squashfs-tools, time)"
done

WORK=$(mktemp -d "$DATA/scale.XXXXXX")
MP=$(mktemp -d /tmp/sheaf-bench-scale.XXXXXX)
CUR=""
umnt() {
    case $CUR in "") ;; sheaf) "$SHEAF" umount "$MP" ;; *) umount "$MP" ;; esac
    CUR=""
}
cleanup() { umnt 2>/dev/null || true; rm -rf "$WORK"; rmdir "$MP" 2>/dev/null || true; }
trap cleanup EXIT

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now_ns() { date +%s%N; }
secs() { awk -v n="$1" 'BEGIN { printf "%.2f", n / 1e9 }'; }
ms() { awk -v n="$1" 'BEGIN { printf "%.1f", n / 1e6 }'; }
mb() { awk -v n="$1" 'BEGIN { printf "%.1f", n / 1e6 }'; }
rate() { awk -v n="$1" -v t="$2" 'BEGIN { printf "%.0f", n / (t / 1e9) / 1e3 }'; } # K/s
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
verdict() { awk -v x="$1" -v t="$2" -v d="${3:-le}" 'BEGIN { ok = (d == "le") ? x <= t : x >= t; print ok ? "met" : "MISSED" }'; }

declare -A R
KEEP=${SCALE_IMAGES:-}
REUSE=""
if [ -n "$KEEP" ]; then
    mkdir -p "$KEEP"
    [ -s "$KEEP/hcp-$N.sheaf" ] && [ -s "$KEEP/hcp-$AN.sqfs" ] && REUSE=1
fi
# build KIND COUNT: wall ns and peak RSS KiB of one build from the generated stream.
build() {
    local kind=$1 n=$2 img s e
    drop_caches
    case $kind in
        sheaf) img=$WORK/hcp-$n.sheaf
               s=$(now_ns)
               "$PYTHON" "$GEN" "$n" | /usr/bin/time -o "$WORK/time" -f '%M' "$SHEAF" build -q - -o "$img"
               e=$(now_ns) ;;
        sqfs)  img=$WORK/hcp-$n.sqfs
               s=$(now_ns)
               "$PYTHON" "$GEN" "$n" | /usr/bin/time -o "$WORK/time" -f '%M' tar2sqfs -q -f -c zstd "$img" >/dev/null
               e=$(now_ns) ;;
    esac
    R[$kind,$n,wall]=$((e - s)); R[$kind,$n,rss]=$(tail -1 "$WORK/time"); R[$kind,$n,size]=$(stat -c %s "$img")
    log "$kind $n entries: $(secs $((e - s))) s, peak RSS $((R[$kind,$n,rss] / 1024)) MiB, $(mb "${R[$kind,$n,size]}") MB"
}
if [ -n "$REUSE" ]; then
    log "reusing $KEEP/hcp-$N.sheaf and $KEEP/hcp-$AN.sqfs: no builds"
else
    log "generator alone, $SMALL entries"
    s=$(now_ns); "$PYTHON" "$GEN" "$SMALL" | wc -c > "$WORK/genbytes"; e=$(now_ns)
    R[gen,wall]=$((e - s)); R[gen,bytes]=$(cat "$WORK/genbytes")
    for n in "$SMALL" "$N"; do build sheaf "$n"; done
    for n in $(printf '%s\n' "$SMALL" "$AN" | sort -nu); do build sqfs "$n"; done
    rm -f "$WORK/hcp-$SMALL.sheaf"
    [ "$SMALL" = "$AN" ] || rm -f "$WORK/hcp-$SMALL.sqfs"
    [ -z "$KEEP" ] || mv "$WORK/hcp-$N.sheaf" "$WORK/hcp-$AN.sqfs" "$KEEP/"
fi

IMG=${KEEP:-$WORK}/hcp-$N.sheaf SQ=${KEEP:-$WORK}/hcp-$AN.sqfs
mnt() {
    case $1 in
        sheaf) "$SHEAF" mount "$IMG" "$MP" ;;
        squashfuse_ll) squashfuse_ll "$SQ" "$MP" ;;
        kernel) mount -t squashfs -o loop,ro "$SQ" "$MP" ;;
    esac
    CUR=$1
}
# mount_times [cold]: sets R[KIND,mount_ret], R[KIND,mount] and
# R[KIND,mount_ls] (mount_cold_* with "cold", after drop_caches each time)
# for sheaf and squashfuse_ll, medians (ns) over MOUNT_ROUNDS rounds in which
# the two alternate, so that both see the same spells of a noisy machine
# (one binary's cold mounts spread over 10 ms here): the mount command
# returning, that plus the root listed by the shell (a glob: no program is
# started, whose own cold load would count), and, in a second cycle, the
# mount plus `ls` of the root (the figure of runs before 2026-11-25 14:00,
# which includes ls loading: 5-8 ms after drop_caches).
MOUNT_ROUNDS=${SCALE_MOUNT_ROUNDS:-15}
mount_times() {
    local cold=${1:-} sfx="" k l s m g e
    [ -n "$cold" ] && sfx=_cold
    local -A a=() b=() c=()
    for _ in $(seq "$MOUNT_ROUNDS"); do
        for k in sheaf squashfuse_ll; do
            [ -n "$cold" ] && drop_caches
            s=$(now_ns); mnt "$k"; m=$(now_ns); l=("$MP"/*); g=$(now_ns)
            [ -e "${l[0]}" ] || die "$k: the root of the mount lists nothing"
            a[$k]+=" $((m - s))"; b[$k]+=" $((g - s))"; umnt
            [ -n "$cold" ] && drop_caches
            s=$(now_ns); mnt "$k"; ls "$MP" >/dev/null; e=$(now_ns)
            c[$k]+=" $((e - s))"; umnt
        done
    done
    for k in sheaf squashfuse_ll; do
        # shellcheck disable=SC2086 # the lists are words
        R[$k,mount${sfx}_ret]=$(median ${a[$k]})
        # shellcheck disable=SC2086
        R[$k,mount$sfx]=$(median ${b[$k]})
        # shellcheck disable=SC2086
        R[$k,mount${sfx}_ls]=$(median ${c[$k]})
    done
}
log "mount time: sheaf and squashfuse_ll alternating, $MOUNT_ROUNDS rounds, warm then cold"
mount_times
mount_times cold

log "sheaf: walk (cold: fresh mount after drop_caches; then warm)"
drop_caches; mnt sheaf
s=$(now_ns); R[sheaf,entries]=$(cd "$MP" && find . | wc -l); e=$(now_ns); R[sheaf,find_first]=$((e - s))
s=$(now_ns); (cd "$MP" && find . >/dev/null); e=$(now_ns); R[sheaf,find_warm]=$((e - s))
pid=$(server_pid "sheaf mount .* $MP\$")
R[sheaf,rss]=$(awk '/VmHWM/ { print $2 }' "/proc/$pid/status")
umnt
log "kernel squashfs: walk"
drop_caches; mnt kernel
s=$(now_ns); R[kernel,entries]=$(cd "$MP" && find . | wc -l); e=$(now_ns); R[kernel,find_first]=$((e - s))
s=$(now_ns); (cd "$MP" && find . >/dev/null); e=$(now_ns); R[kernel,find_warm]=$((e - s))
umnt
log "sheaf find (no mount)"
"$SHEAF" find "$IMG" >/dev/null   # page cache warm
v=()
for _ in 1 2 3; do s=$(now_ns); "$SHEAF" find "$IMG" | wc -l > "$WORK/n"; e=$(now_ns); v+=($((e - s))); done
R[sfind]=$(median "${v[@]}"); R[sfind,n]=$(cat "$WORK/n")

# From a directory: tree M.
if [ -d "$DATA/M" ]; then
    M_ENTRIES=$(find "$DATA/M" | wc -l)
    for kind in sheaf mksquashfs; do
        log "$kind: tree M from its directory"
        drop_caches
        s=$(now_ns)
        case $kind in
            sheaf) /usr/bin/time -o "$WORK/time" -f '%M' "$SHEAF" build -q "$DATA/M" -o "$WORK/M.sheaf" ;;
            mksquashfs) /usr/bin/time -o "$WORK/time" -f '%M' mksquashfs "$DATA/M" "$WORK/M.sqfs" -noappend -comp zstd -quiet -no-progress >/dev/null ;;
        esac
        e=$(now_ns)
        R[M,$kind,wall]=$((e - s)); R[M,$kind,rss]=$(tail -1 "$WORK/time")
    done
fi

[ -n "$REUSE" ] || PER_ENTRY=$(awk -v a="${R[sheaf,$N,rss]}" -v b="${R[sheaf,$SMALL,rss]}" -v n="$N" -v m="$SMALL" 'BEGIN { printf "%.0f", (a - b) * 1024 / (n - m) }')
# (No slope for tar2sqfs when it built one size only.)
[ -n "$REUSE" ] || SQ_PER_ENTRY=$(awk -v a="${R[sqfs,$AN,rss]}" -v b="${R[sqfs,$SMALL,rss]}" -v n="$AN" -v m="$SMALL" 'BEGIN { if (n == m) print "n/a"; else printf "%.0f", (a - b) * 1024 / (n - m) }')
{
    echo "# HCP scale: $N entries, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "Machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r); load at end $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "sheaf $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- crates 2>/dev/null || echo ' (+ uncommitted changes)'); $(tar2sqfs --version 2>&1 | head -1); squashfuse $(dpkg-query -W -f '${Version}' squashfuse 2>/dev/null)."
    if [ -n "$REUSE" ]; then
    echo "Input: the images of an earlier run of \`bench/gen-tar.py $N\` (and $AN for the anchors), kept in $KEEP (SCALE_IMAGES): nothing was built this run."
    echo
    else
    echo "Input: \`bench/gen-tar.py $N\` (HCP-like: subjects of ~14.5K entries, 48 files per directory, files 12 B–1 KiB, all different); the generator alone makes $SMALL entries ($(mb "${R[gen,bytes]}") MB of tar) in $(secs "${R[gen,wall]}") s."
    echo "Builds read the stream from a pipe (generation time included), page cache dropped before each, one run each: sheaf default options; tar2sqfs \`-c zstd\`."
    echo
    echo "## Building from a tar stream"
    echo
    echo "| builder | entries | wall s | peak RSS MiB | image MB |"
    echo "|---|---:|---:|---:|---:|"
    for k in sheaf sqfs; do for n in $(printf '%s\n' "$SMALL" "$N" "$AN" | sort -nu); do
        [ -n "${R[$k,$n,wall]:-}" ] || continue
        echo "| $( [ $k = sheaf ] && echo sheaf || echo tar2sqfs ) | $n | $(secs "${R[$k,$n,wall]}") | $((R[$k,$n,rss] / 1024)) | $(mb "${R[$k,$n,size]}") |"
    done; done
    echo
    echo "Builder memory per entry (slope between the two builds): sheaf **$PER_ENTRY B**, tar2sqfs ${SQ_PER_ENTRY/%[0-9]/& B}."
    echo
    fi
    echo "## Reading the $N-entry image"
    echo
    [ "$AN" = "$N" ] || echo "The anchors (tar2sqfs, squashfuse_ll, kernel squashfs) use the $AN-entry stream's image (SCALE_ANCHOR_ENTRIES); rates are per entry."
    echo
    echo "| | sheaf | squashfuse_ll (tar2sqfs image) | kernel squashfs |"
    echo "|---|---:|---:|---:|"
    mt() { echo "$(ms "${R[$1,$2_ret]}") / **$(ms "${R[$1,$2]}")** / $(ms "${R[$1,$2_ls]}")"; }
    echo "| mount ms, warm: returned / **root listed** / with \`ls\` (medians of $MOUNT_ROUNDS rounds, alternating with squashfuse_ll) | $(mt sheaf mount) | $(mt squashfuse_ll mount) | |"
    echo "| mount ms, after drop_caches: the same three | $(mt sheaf mount_cold) | $(mt squashfuse_ll mount_cold) | |"
    echo "| cold find (fresh mount after drop_caches), K entries/s | $(rate "${R[sheaf,entries]}" "${R[sheaf,find_first]}") | | $(rate "${R[kernel,entries]}" "${R[kernel,find_first]}") |"
    echo "| warm find, K entries/s | $(rate "${R[sheaf,entries]}" "${R[sheaf,find_warm]}") | | $(rate "${R[kernel,entries]}" "${R[kernel,find_warm]}") |"
    echo "| server peak RSS after the walks, MiB | $((R[sheaf,rss] / 1024)) | | |"
    echo "| \`sheaf find IMAGE\` (no mount, page cache warm), K entries/s | $(rate "${R[sfind,n]}" "${R[sfind]}") | | |"
    if [ -n "${R[M,sheaf,wall]:-}" ]; then
        echo
        echo "## From a directory: tree M ($M_ENTRIES entries)"
        echo
        echo "| builder | wall s | peak RSS MiB |"
        echo "|---|---:|---:|"
        echo "| sheaf | $(secs "${R[M,sheaf,wall]}") | $((R[M,sheaf,rss] / 1024)) |"
        echo "| mksquashfs -comp zstd | $(secs "${R[M,mksquashfs,wall]}") | $((R[M,mksquashfs,rss] / 1024)) |"
    fi
    echo
    echo "## Targets"
    echo
    echo "| target | measured | |"
    echo "|---|---|---|"
    if [ -z "$REUSE" ]; then
    echo "| builder ≤ 150 B per entry | $PER_ENTRY B | $(verdict "$PER_ENTRY" 150) |"
    x=$(awk -v a="${R[sheaf,$AN,wall]:-${R[sheaf,$SMALL,wall]}}" -v b="${R[sqfs,$AN,wall]}" 'BEGIN { printf "%.2f", a / b }')
    [ "$AN" = "$N" ] && echo "| build time vs tar2sqfs, same stream (no target given; reported) | ${x}× | — |"
    x=$(awk -v a="${R[sheaf,$SMALL,wall]}" -v b="${R[sqfs,$SMALL,wall]}" 'BEGIN { printf "%.2f", a / b }')
    echo "| build time vs tar2sqfs, $SMALL entries | ${x}× | — |"
    fi
    x=$(ms "${R[sheaf,mount_cold]}"); echo "| mount ≤ 20 ms after drop_caches (mount and its root listed by the shell; with a cold \`ls\`: $(ms "${R[sheaf,mount_cold_ls]}") ms, squashfuse_ll $(ms "${R[squashfuse_ll,mount_cold_ls]}")) | $x ms | $(verdict "$x" 20) |"
    x=$(ms "${R[sheaf,mount]}"); echo "| mount ≤ 20 ms warm (the same) | $x ms | $(verdict "$x" 20) |"
    x=$((R[sheaf,rss] / 1024)); echo "| server RSS ≤ 64 MiB + caches (64 MiB page + 256 MiB block cache by default) | $x MiB | $(verdict "$x" $((64 + 64 + 256))) |"
    x=$(rate "${R[sheaf,entries]}" "${R[sheaf,find_warm]}"); echo "| warm find ≥ 1M entries/s | ${x}K/s | $(verdict "$x" 1000 ge) |"
    x=$(rate "${R[sfind,n]}" "${R[sfind]}"); echo "| sheaf find ≥ 2M entries/s | ${x}K/s | $(verdict "$x" 2000 ge) |"
    if [ -n "${R[M,sheaf,wall]:-}" ]; then
        x=$(awk -v a="${R[M,mksquashfs,wall]}" -v b="${R[M,sheaf,wall]}" 'BEGIN { printf "%.2f", a / b }')
        echo "| tree M from a directory ≥ 2× mksquashfs speed | ${x}× | $(verdict "$x" 2 ge) |"
    fi
} > "$OUT"
cat "$OUT"
log "wrote $OUT"
