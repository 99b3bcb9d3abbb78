#!/usr/bin/env bash
# A container's writable root, two ways (issue 14 §3 "measure and choose"):
#   union    one `sheaf mount IMAGE ROOT --upper UPPER` process serves the layers and the
#            writable upper itself (what the snapshotter gives containerd today)
#   overlay  a read-only `sheaf mount IMAGE LOWER`, and kernel overlayfs on top of it
#            (lowerdir=LOWER, upperdir=UPPER): stargz's design
# over the flattened sci image of bench/containers.sh (Debian + python3 + numpy + scipy).
# Each workload on a fresh mount after drop_caches, medians of RUNS, run chrooted as root:
#   start    python3 -c 'import numpy, scipy.linalg'          (cold: lazy reads)
#   stat     ls -lR /usr twice; the second timed               (warm metadata)
#   create   5000 files of 1 KiB and one of 64 MiB written, then sync
#   copyup   one byte appended to each of 200 library files (copy-up of the whole file)
#   read     every byte under /usr/lib/python3 read (tar through a pipe), cold
# Writes bench/results/DATE-overlay.md.
# Usage: bench/overlay.sh  (root; after bench/containers.sh, whose OCI layout it flattens)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
RUNS=${RUNS:-3}
IMAGE=${IMAGE:-$DATA/containers/sci.sheaf}
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-overlay.md
log() { printf '[overlay-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (overlayfs, chroot, drop_caches)"
if [ ! -f "$IMAGE" ]; then
  [ -f "$DATA/containers/oci/index.json" ] || die "no image: run bench/containers.sh first"
  "$SHEAF" import "oci:$DATA/containers/oci:sci" --flatten -o "$IMAGE" -q
fi
W=$(mktemp -d "$DATA/overlay.XXXXXX")
cleanup() {
  for m in $(grep " $W" /proc/self/mountinfo | awk '{print $5}' | sort -r); do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$W"
}
trap cleanup EXIT INT TERM

setup() { # MODE -> prints the container root
  local mode=$1 d=$W/$1
  for m in $(grep " $d" /proc/self/mountinfo | awk '{print $5}' | sort -r); do
    "$SHEAF" umount "$m" 2>/dev/null || umount "$m"
  done
  rm -rf "$d"; mkdir -p "$d/root" "$d/upper" "$d/work" "$d/lower"
  if [ "$mode" = union ]; then
    "$SHEAF" mount "$IMAGE" "$d/root" --upper "$d/upper" -o allow_other,suid,dev
  else
    "$SHEAF" mount "$IMAGE" "$d/lower" -o allow_other,suid,dev
    mount -t overlay overlay -o "lowerdir=$d/lower,upperdir=$d/upper,workdir=$d/work" "$d/root"
  fi
  mount --bind /dev "$d/root/dev"; mount -t proc proc "$d/root/proc"
  echo "$d/root"
}
teardown() {
  local d=$W/$1
  for m in $(grep " $d" /proc/self/mountinfo | awk '{print $5}' | sort -r); do
    case $m in */root) umount "$m" ;; *) umount "$m" 2>/dev/null || true ;; esac
  done
  for m in $(grep " $d" /proc/self/mountinfo | awk '{print $5}' | sort -r); do "$SHEAF" umount "$m"; done
}
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 )); }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

work() { # WORKLOAD ROOT
  local r=$2
  case $1 in
    start) ms chroot "$r" python3 -c 'import numpy, scipy.linalg' ;;
    stat) chroot "$r" ls -lR /usr >/dev/null; ms chroot "$r" ls -lR /usr ;;
    create) ms chroot "$r" python3 -c '
import os
os.makedirs("/t", exist_ok=True)
for i in range(5000):
    with open("/t/f%d" % i, "wb") as f: f.write(b"x" * 1024)
with open("/t/big", "wb") as f:
    for _ in range(64): f.write(b"y" * (1 << 20))
os.sync()' ;;
    copyup) ms chroot "$r" sh -c 'find /usr/lib/x86_64-linux-gnu -maxdepth 1 -type f -name "*.so*" | head -n 200 | while read -r f; do printf x >> "$f"; done; sync' ;;
    # (through a pipe: GNU tar writing to /dev/null itself skips reading the files)
    read) ms chroot "$r" sh -c 'tar -cf - /usr/lib/python3 2>/dev/null | cat >/dev/null' ;;
  esac
}

declare -A R
for w in start stat create copyup read; do
  for mode in union overlay; do
    v=()
    for i in $(seq "$RUNS"); do
      root=$(setup "$mode")
      drop
      t=$(work "$w" "$root")
      teardown "$mode"
      v+=("$t")
      log "$w $mode run $i: $t ms"
    done
    R[$w,$mode]=$(median "${v[@]}")
  done
done
{
  echo "# A container's writable root: one sheaf union process vs kernel overlayfs over a read-only sheaf mount"
  echo
  echo "$(date -u +%Y-%m-%d\ %H:%M) UTC, $(nproc) cores, kernel $(uname -r); sheaf $(git -C "$ROOT" rev-parse --short HEAD); image $(basename "$IMAGE") ($(du -m "$IMAGE" | cut -f1) MiB, local file). Each workload on a fresh mount after drop_caches, chrooted, medians of $RUNS."
  echo
  echo "| workload | sheaf union + upper | overlayfs over sheaf | overlay / union |"
  echo "|---|---|---|---|"
  for w in start stat create copyup read; do
    printf '| %s | %s ms | %s ms | %.2f |\n' "$w" "${R[$w,union]}" "${R[$w,overlay]}" "$(echo "${R[$w,overlay]} / ${R[$w,union]}" | bc -l)"
  done
  echo
  echo "start: python3 -c 'import numpy, scipy.linalg' (cold). stat: ls -lR /usr, second run. create: 5000 x 1 KiB + 64 MiB, synced. copyup: append a byte to 200 libraries. read: tar of /usr/lib/python3 through a pipe (cold)."
} > "$OUT"
cat "$OUT"
log "wrote $OUT"
