#!/usr/bin/env bash
# Metadata-heavy tools on a warm mount (issue 15 §1): `ls -lR`, `find -printf` of
# modes and sizes, `du -s`, on tree K, kernel squashfs (zstd, loop) against sheaf,
# in the same run. Each round: drop_caches, one untimed pass to warm both, then the
# timed pass; medians of RUNS. Also the number of getxattr requests that reached
# sheaf (the kernel keeps no xattr cache for FUSE; an image without xattrs answers
# the first with ENOSYS so the kernel stops asking).
# Writes bench/results/DATE-metadata.md.
# Usage: bench/metadata.sh  (root; after bench/setup.sh K)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
RUNS=${RUNS:-3}
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-metadata.md
log() { printf '[metadata-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (loop mounts, drop_caches)"
[ -d "$DATA/K" ] || die "$DATA/K missing: run bench/setup.sh K"
W=$(mktemp -d "$DATA/metadata.XXXXXX")
cleanup() { umount "$W/sq" 2>/dev/null || true; "$SHEAF" umount "$W/sh" 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT INT TERM
log "building K both ways"
"$SHEAF" build "$DATA/K" -o "$W/k.sheaf" -q
mksquashfs "$DATA/K" "$W/k.sqfs" -comp zstd -quiet -noappend >/dev/null
mkdir -p "$W/sq" "$W/sh"
mount -o loop,ro "$W/k.sqfs" "$W/sq"
"$SHEAF" mount "$W/k.sheaf" "$W/sh"
ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 )); }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
tool() { # NAME DIR
  case $1 in
    ls-lR) ls -lR "$2" ;;
    find-printf) find "$2" -printf '%M %s %u\n' ;;
    du) du -s "$2" ;;
  esac
}
declare -A R
for t in ls-lR find-printf du; do
  a=(); b=()
  for i in $(seq "$RUNS"); do
    sync; echo 3 > /proc/sys/vm/drop_caches
    tool "$t" "$W/sq" >/dev/null; tool "$t" "$W/sh" >/dev/null
    a+=("$(ms tool "$t" "$W/sq")"); b+=("$(ms tool "$t" "$W/sh")")
    log "$t round $i: squashfs ${a[-1]} ms, sheaf ${b[-1]} ms"
  done
  R[$t,sq]=$(median "${a[@]}"); R[$t,sh]=$(median "${b[@]}")
done
gx=$("$SHEAF" stats --json "$W/sh" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ops"].get("getxattr",{}).get("count",0))')
{
  echo "# Metadata tools on a warm mount: kernel squashfs vs sheaf"
  echo
  echo "$(date -u +%Y-%m-%d\ %H:%M) UTC, $(nproc) cores, kernel $(uname -r); sheaf $(git -C "$ROOT" rev-parse --short HEAD); tree K ($(find "$DATA/K" | wc -l) entries). Warm: after drop_caches, one untimed pass, then the timed one; medians of $RUNS."
  echo
  echo "| tool | kernel squashfs (zstd) | sheaf | sheaf / kernel |"
  echo "|---|---|---|---|"
  for t in ls-lR find-printf du; do
    printf '| %s | %s ms | %s ms | %.2f |\n' "$t" "${R[$t,sq]}" "${R[$t,sh]}" "$(echo "${R[$t,sh]} / ${R[$t,sq]}" | bc -l)"
  done
  echo
  echo "getxattr requests that reached sheaf over all $((RUNS * 6)) passes: $gx (target of issue 15: warm ls -lR <= 1.2x kernel squashfs)."
} > "$OUT"
cat "$OUT"
log "wrote $OUT"
