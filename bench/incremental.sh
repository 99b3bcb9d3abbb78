#!/usr/bin/env bash
# Incremental builds (`sheaf build --base PREV`, docs/build.md) on tree P: a
# scratch copy of P is built in full (PREV), 1% of its regular files are
# changed (every 100th by sorted path gets one byte appended, so size and
# mtime change), then a full rebuild and a --base build of the changed tree
# are timed (median of RUNS, page cache dropped before each), and the objects
# of each result whose digest is not among PREV's are counted (data blocks
# and metadata pages, as `sheaf publish` writes them; object = what a node
# cache or repository must fetch anew). Targets (issue): --base time <= 0.1x
# the full rebuild's, new objects <= 1.5x the full rebuild's. The --base
# image is also checked (`sheaf check`) and extracted and compared with the
# changed tree (`diff -r`). The strict rule (--base-stale 0: copy only blocks
# all of whose files are unchanged) is measured alongside, once.
# Writes bench/results/DATE-incremental.md.
# Usage: bench/incremental.sh  (root, for drop_caches; after bench/setup.sh P)
# Env:   SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench), RUNS (default 3)
set -euo pipefail
export LC_ALL=C # sort and join must agree on the order
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
RUNS=${RUNS:-3}
OUT=$ROOT/bench/results/$(date -u +%Y-%m-%d-%H%M)-incremental.md
log() { printf '[incremental-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (drop_caches)"
[ -d "$DATA/P" ] || die "$DATA/P missing: run bench/setup.sh P"
# The scratch copy lives beside the data (never the original: it is changed).
W=$(mktemp -d "$DATA/incremental.XXXXXX")
trap 'rm -rf "$W"' EXIT INT TERM
log "copying P to $W/P"
cp -a "$DATA/P" "$W/P"
"$SHEAF" build "$W/P" -o "$W/prev.sheaf" -q
files=$(find "$W/P" -type f | wc -l)
log "changing every 100th of $files regular files (sorted path): one byte appended"
changed=0; changed_bytes=0
while IFS= read -r -d '' f; do
  printf 'x' >> "$f"
  changed=$((changed + 1)); changed_bytes=$((changed_bytes + $(stat -c %s "$f")))
done < <(find "$W/P" -type f -print0 | sort -z | awk -v RS='\0' -v ORS='\0' 'NR % 100 == 0')

ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 )); }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
full=(); inc=()
for i in $(seq "$RUNS"); do
  sync; echo 3 > /proc/sys/vm/drop_caches
  full+=("$(ms "$SHEAF" build "$W/P" -o "$W/full.sheaf" -q -f)")
  sync; echo 3 > /proc/sys/vm/drop_caches
  inc+=("$(ms "$SHEAF" build "$W/P" -o "$W/inc.sheaf" -q -f --base "$W/prev.sheaf")")
  log "round $i: full ${full[-1]} ms, --base ${inc[-1]} ms"
done
tf=$(median "${full[@]}"); ti=$(median "${inc[@]}")
sync; echo 3 > /proc/sys/vm/drop_caches
ts=$(ms "$SHEAF" build "$W/P" -o "$W/strict.sheaf" -q --base "$W/prev.sheaf" --base-stale 0)
log "strict (--base-stale 0): $ts ms"
rep=$("$SHEAF" build "$W/P" -o "$W/inc2.sheaf" -q --json --base "$W/prev.sheaf")
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print(d$1)"; }

# Objects by digest, as `sheaf publish` names them.
objects() { "$SHEAF" publish "$1" "$W/repo-$2" --name "$2" >/dev/null
  (cd "$W/repo-$2/objects" && find . -type f -printf '%f %s\n' | sort); }
objects "$W/prev.sheaf" prev > "$W/o-prev"
new_objects() { objects "$W/$1.sheaf" "$1" > "$W/o-$1"
  join -v1 "$W/o-$1" "$W/o-prev" | awk '{n++; b+=$2} END {print n+0, b+0}'; }
read -r nf bf < <(new_objects full)
read -r ni bi < <(new_objects inc)
read -r ns bs < <(new_objects strict)
all_i=$(wc -l < "$W/o-inc")

log "checking and extracting the --base image"
"$SHEAF" check "$W/inc.sheaf" >/dev/null
"$SHEAF" extract "$W/inc.sheaf" -C "$W/x" >/dev/null
same=yes; diff -r --no-dereference "$W/P" "$W/x" >/dev/null || same="NO (diff -r differs)"
mb() { echo "scale=1; $1 / 1000000" | bc; }
{
  echo "# Incremental build (--base) of tree P, 1% of files changed"
  echo
  echo "$(date -u +%Y-%m-%d\ %H:%M) UTC, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; sheaf $(git -C "$ROOT" rev-parse --short HEAD); tree P ($files regular files, $(du -sm "$DATA/P" | cut -f1) MB), default options (zstd:12, 4 MiB blocks). $changed files changed ($(mb "$changed_bytes") MB after the change): every 100th regular file by sorted path, one byte appended. Times: medians of $RUNS, page cache dropped before each."
  echo
  sz() { stat -c %s "$W/$1.sheaf"; }
  echo "| | full rebuild | --base PREV | --base / full | target | --base-stale 0 (one run) | strict / full |"
  echo "|---|---|---|---|---|---|---|"
  printf '| time | %s ms | %s ms | %.3f | <= 0.1 | %s ms | %.3f |\n' "$tf" "$ti" "$(echo "$ti / $tf" | bc -l)" "$ts" "$(echo "$ts / $tf" | bc -l)"
  printf '| new objects (digest not in PREV) | %s | %s | %.2f | <= 1.5 | %s | %.2f |\n' "$nf" "$ni" "$(echo "$ni / $nf" | bc -l)" "$ns" "$(echo "$ns / $nf" | bc -l)"
  printf '| their bytes (stored) | %s MB | %s MB | %.2f | | %s MB | %.2f |\n' "$(mb "$bf")" "$(mb "$bi")" "$(echo "$bi / $bf" | bc -l)" "$(mb "$bs")" "$(echo "$bs / $bf" | bc -l)"
  printf '| image | %s MB | %s MB | %.3f | | %s MB | %.3f |\n' "$(mb "$(sz full)")" "$(mb "$(sz inc)")" "$(echo "$(sz inc) / $(sz full)" | bc -l)" \
    "$(mb "$(sz strict)")" "$(echo "$(sz strict) / $(sz full)" | bc -l)"
  echo
  echo "Full rebuild runs: ${full[*]} ms; --base runs: ${inc[*]} ms. The --base image has $all_i objects in all."
  echo "From PREV: $(echo "$rep" | json '["base"]["reused_files"]') files ($(mb "$(echo "$rep" | json '["base"]["reused_bytes"]')") MB) reused in $(echo "$rep" | json '["base"]["copied_blocks"]') copied blocks; $(echo "$rep" | json '["base"]["packed_files"]') files ($(mb "$(echo "$rep" | json '["base"]["packed_bytes"]')") MB) read and packed anew; stale bytes kept in copied blocks: $(mb "$(echo "$rep" | json '["base"]["stale_bytes"]')") MB (--base-stale 20)."
  echo "sheaf check of the --base image: ok; extracted tree equal to the changed source (diff -r): $same."
} > "$OUT"
cat "$OUT"
log "wrote $OUT"
