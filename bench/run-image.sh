#!/usr/bin/env bash
# Start time of a command in a container image without a daemon (issue 14 §2):
#   sheaf      sheaf run --image IMAGE.sheaf -- python3 -c pass
#   apptainer  what `apptainer exec` does with a SIF (Apptainer is not packaged in Debian
#              12, so its method stands in): squashfuse_ll mount of a mksquashfs image of
#              the same root, then a private mount namespace, chroot, the command, unmount
# over the flattened sci image of bench/containers.sh (Debian + python3 + numpy + scipy).
# cold = after drop_caches; warm = again at once (a new mount each time, page cache warm).
# Medians of RUNS. Writes bench/results/DATE-run-image.md.
# Usage: bench/run-image.sh  (root)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
RUNS=${RUNS:-3}
IMAGE=${IMAGE:-$DATA/containers/sci.sheaf}
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-run-image.md
log() { printf '[run-image-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (drop_caches)"
for p in squashfuse_ll mksquashfs unshare; do command -v $p >/dev/null || die "$p missing (scripts/deps.sh bench)"; done
if [ ! -f "$IMAGE" ]; then
  [ -f "$DATA/containers/oci/index.json" ] || die "no image: run bench/containers.sh first"
  "$SHEAF" import "oci:$DATA/containers/oci:sci" --flatten -o "$IMAGE" -q
fi
W=$(mktemp -d "$DATA/run-image.XXXXXX")
trap 'umount -l "$W/mp" 2>/dev/null || true; rm -rf "$W"' EXIT INT TERM
SQFS=$DATA/containers/sci.sqfs
if [ ! -f "$SQFS" ] || [ "$SQFS" -ot "$IMAGE" ]; then
  log "extracting and mksquashfs (zstd) of the same root"
  mkdir -p "$W/rootfs"; "$SHEAF" extract "$IMAGE" -C "$W/rootfs" >/dev/null
  mksquashfs "$W/rootfs" "$SQFS.part" -comp zstd -quiet -noappend >/dev/null
  mv "$SQFS.part" "$SQFS"; rm -rf "$W/rootfs"
fi
mkdir -p "$W/mp"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 )); }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
one_sheaf() { "$SHEAF" run --image "$IMAGE" -- python3 -c pass; }
one_apptainer() {
  squashfuse_ll "$SQFS" "$W/mp"
  unshare --mount --fork chroot "$W/mp" python3 -c pass
  fusermount3 -u "$W/mp"
}
declare -A R
for mode in sheaf apptainer; do
  for temp in cold warm; do
    v=()
    for i in $(seq "$RUNS"); do
      [ "$temp" = cold ] && drop
      t=$(ms "one_$mode")
      v+=("$t"); log "$mode $temp run $i: $t ms"
    done
    R[$mode,$temp]=$(median "${v[@]}")
  done
done
{
  echo "# Running a command in a container image without a daemon: sheaf run --image vs Apptainer's method"
  echo
  echo "$(date -u +%Y-%m-%d\ %H:%M) UTC, $(nproc) cores; sheaf $(git -C "$ROOT" rev-parse --short HEAD); $(basename "$IMAGE") ($(du -m "$IMAGE" | cut -f1) MiB) and $(basename "$SQFS") ($(du -m "$SQFS" | cut -f1) MiB, mksquashfs zstd) of the same root. \`python3 -c pass\`, whole invocation timed (mount, namespace, command, unmount); medians of $RUNS."
  echo
  echo "| | sheaf run --image | squashfuse_ll + unshare + chroot (Apptainer's method) | sheaf / apptainer |"
  echo "|---|---|---|---|"
  for temp in cold warm; do
    printf '| %s | %s ms | %s ms | %.2f |\n' "$temp" "${R[sheaf,$temp]}" "${R[apptainer,$temp]}" "$(echo "${R[sheaf,$temp]} / ${R[apptainer,$temp]}" | bc -l)"
  done
  echo
  echo "sheaf run --image also sets up what Apptainer does (a writable tmp upper, /proc, /sys, /dev, \$HOME, /tmp, the cwd, resolv.conf, passwd/group, the config's Env and WorkingDir); the stand-in does none of it, so it is a lower bound for Apptainer."
} > "$OUT"
cat "$OUT"
log "wrote $OUT"
