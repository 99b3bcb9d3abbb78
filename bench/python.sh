#!/usr/bin/env bash
# The Python package against the Python ways to read the same tree without
# a mount (issue 40). Writes bench/results/DATE-python.md.
#
# Tree: the HCP-like tree of N entries (bench/gen-tar.py), as a tar, a
# sheaf image (built from the tar) and a SquashFS image (mksquashfs -tar).
# 1. Open and list the root: sheaf.open + listdir against ratarmountcore
#    (SQLiteIndexedTar, its index built beforehand, outside the timing) and
#    PySquashfsImage. Target <= 50 ms at 1M entries.
# 2. 10,000 random small files from one process: sheaf read_many, a loop of
#    sheaf open().read(), ratarmountcore, fsspec tar:// (its index, built on
#    open, outside the timing) and a loop over a kernel squashfs mount.
#    Targets: >= 3x ratarmountcore, >= 5x fsspec tar://, >= 1x the mount.
# 3. h5py reads a hyperslab over HTTP (nginx): sheaf against h5py on the raw
#    .h5 through fsspec's HTTP filesystem; bytes from nginx's log and time.
# Every figure: the median of RUNS fresh processes, the page cache dropped
# before each (when the kernel lets us: root).
#
# Usage: bench/python.sh   (after make build; installs ratarmountcore and
#                           PySquashfsImage into target/pyenv)
# Env:   TREE (hcp, default, or P: tree P of bench/setup.sh, the Python stack,
#        as a tar of it), N (entries of hcp, default 1000000), RUNS (default 3), SHEAF_BENCH_DATA
#        (default /var/tmp/sheaf-bench; the tree is kept in DATA/python-N),
#        CASES (a subset of the case names in ALL below; the rest show n/a).
#        fsspec tar:// takes about 9 minutes at 1M entries (timed once).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${N:-1000000}
RUNS=${RUNS:-3}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
TREE=${TREE:-hcp}
case "$TREE" in
    hcp) D=$DATA/python-$N ;;
    P) D=$DATA/python-P ;;
    *) echo "bench/python.sh: TREE=$TREE: hcp or P" >&2; exit 2 ;;
esac
SHEAF=$ROOT/target/release/sheaf
VENV=${SHEAF_PYENV:-$ROOT/target/pyenv}
PYTHON=$VENV/bin/python
WORK=$(mktemp -d)
WWW=$WORK/www
die() { echo "bench/python.sh: $*" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
MNT=$WORK/sqmnt
cleanup() {
    mountpoint -q "$MNT" 2>/dev/null && umount "$MNT"
    [ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
[ -x "$SHEAF" ] || die "$SHEAF: run make build first"
"$ROOT/scripts/python.sh" wheel >/dev/null
"$ROOT/scripts/pyenv.sh" "$VENV"
"$PYTHON" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$(ls -t "$ROOT"/target/wheels/sheaf-*-abi3-*.whl | head -1)"
"$PYTHON" -m pip install -q --disable-pip-version-check ratarmountcore PySquashfsImage
command -v mksquashfs >/dev/null || die "mksquashfs missing (scripts/deps.sh bench)"

mkdir -p "$D" "$WWW"
if [ ! -s "$D/tree.tar" ]; then
    if [ "$TREE" = P ]; then
        [ -d "$DATA/P" ] || die "$DATA/P missing (bench/setup.sh P)"
        # Top-level names, not ".": members without a "./" prefix.
        mapfile -t top < <(ls -A "$DATA/P")
        tar -C "$DATA/P" -cf "$D/tree.tar.tmp" -- "${top[@]}"
    else
        python3 "$ROOT/bench/gen-tar.py" "$N" > "$D/tree.tar.tmp"
    fi
    mv "$D/tree.tar.tmp" "$D/tree.tar"
fi
[ -s "$D/tree.sheaf" ] && [ "$D/tree.sheaf" -nt "$SHEAF" ] || "$SHEAF" build -q -f "$D/tree.tar" -o "$D/tree.sheaf"
[ -s "$D/tree.sqfs" ] || mksquashfs - "$D/tree.sqfs" -tar -quiet -no-progress < "$D/tree.tar" >/dev/null
# The ratarmount index, outside every timing.
[ -s "$D/tree.tar.index.sqlite" ] || "$PYTHON" - "$D" <<'EOF'
import sys
from ratarmountcore.mountsource.formats.tar import SQLiteIndexedTar
d = sys.argv[1]
SQLiteIndexedTar(f"{d}/tree.tar", writeIndex=True, indexFilePath=f"{d}/tree.tar.index.sqlite").close() if hasattr(SQLiteIndexedTar, "close") else None
EOF
# The 10,000 files: random regular files of the tree, fixed seed.
[ -s "$D/sample.txt" ] || "$PYTHON" - "$D" <<'EOF'
import random, sys, sheaf
d = sys.argv[1]
files = sheaf.open(f"{d}/tree.sheaf").files()
random.Random(40).shuffle(files)
open(f"{d}/sample.txt", "w").write("\n".join(files[:10000]) + "\n")
EOF
mkdir -p "$MNT"
mount -t squashfs -o loop,ro "$D/tree.sqfs" "$MNT" 2>/dev/null || die "cannot mount $D/tree.sqfs (needs root and loop devices)"

# The 64 MiB HDF5 file for part 3, served by nginx as a raw file and in an image.
if [ ! -s "$D/h5.sheaf" ]; then
    mkdir -p "$D/h5src"
    "$PYTHON" -c "
import h5py, numpy as np
x = np.random.default_rng(5).standard_normal((4096, 2048))
with h5py.File('$D/h5src/data.h5', 'w') as f: f.create_dataset('x', data=x, chunks=(256, 256))"
    "$SHEAF" build -q "$D/h5src" -o "$D/h5.sheaf" --block-size 1M
fi
ln -s "$D/h5.sheaf" "$WWW/h5.sheaf"
ln -s "$D/h5src/data.h5" "$WWW/data.h5"
start_nginx
sed -i 's|access_log off;|log_format b "$body_bytes_sent"; access_log '"$WORK"'/access.log b;|' "$WORK/nginx.conf"
kill "$NGINX_PID"; wait "$NGINX_PID" 2>/dev/null || true
nginx -e "$WORK/nginx-tmp/error.log" -c "$WORK/nginx.conf" </dev/null & NGINX_PID=$!
sleep 0.5

drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
COLD=yes; [ -w /proc/sys/vm/drop_caches ] || COLD="no (not root: warm caches)"

# run CASE: one fresh process; prints its own seconds (from after imports).
run() {
    drop
    # The last line: what the case printed (ratarmountcore talks on stdout).
    "$PYTHON" - "$D" "$MNT" "$BASE" "$WORK" "$1" 2>/dev/null <<'EOF' | tail -1
import sys, time, os
d, mnt, base, work, case = sys.argv[1:]
sample = open(f"{d}/sample.txt").read().splitlines()
import sheaf, fsspec, h5py
t = time.perf_counter
if case == "open-sheaf":
    s = t(); im = sheaf.open(f"{d}/tree.sheaf"); names = im.listdir(""); e = t()
elif case == "open-ratarmount":
    from ratarmountcore.mountsource.formats.tar import SQLiteIndexedTar
    s = t(); a = SQLiteIndexedTar(f"{d}/tree.tar", indexFilePath=f"{d}/tree.tar.index.sqlite"); names = list(a.list("/")); e = t()
elif case == "open-pysquashfs":
    from PySquashfsImage import SquashFsImage
    s = t(); q = SquashFsImage.from_file(f"{d}/tree.sqfs"); names = list(q.root.children); e = t()
elif case == "read-sheaf-many":
    im = sheaf.open(f"{d}/tree.sheaf")
    s = t(); b = im.read_many(sample); e = t()
elif case == "read-sheaf-loop":
    im = sheaf.open(f"{d}/tree.sheaf")
    s = t()
    for p in sample:
        with im.open(p) as f: f.read()
    e = t()
elif case == "read-ratarmount":
    from ratarmountcore.mountsource.formats.tar import SQLiteIndexedTar
    a = SQLiteIndexedTar(f"{d}/tree.tar", indexFilePath=f"{d}/tree.tar.index.sqlite")
    s = t()
    for p in sample:
        with a.open(a.lookup("/" + p)) as f: f.read()
    e = t()
elif case == "read-fsspec-tar":
    fs = fsspec.filesystem("tar", fo=f"{d}/tree.tar")
    fs.ls("")  # builds its index: outside the timing
    s = t()
    for p in sample:
        with fs.open(p) as f: f.read()
    e = t()
elif case == "read-kernel-squashfs":
    s = t()
    for p in sample:
        with open(f"{mnt}/{p}", "rb") as f: f.read()
    e = t()
elif case in ("h5-sheaf", "h5-fsspec-http"):
    log = f"{work}/access.log"
    before = sum(int(x) for x in open(log).read().split()) if os.path.exists(log) else 0
    s = t()
    if case == "h5-sheaf":
        f = sheaf.open(f"{base}/h5.sheaf", cache=False).open("data.h5")
    else:
        f = fsspec.filesystem("http").open(f"{base}/data.h5")
    with h5py.File(f, "r") as h:
        x = h["x"][1024:1536, 512:1024]
    e = t()
    time.sleep(0.2)
    after = sum(int(x) for x in open(log).read().split())
    print(f"{e - s:.6f} {after - before}")
    sys.exit(0)
print(f"{e - s:.6f}")
EOF
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -A T B ONCE
ALL="open-sheaf open-ratarmount open-pysquashfs read-sheaf-many read-sheaf-loop read-ratarmount read-fsspec-tar read-kernel-squashfs h5-sheaf h5-fsspec-http"
for c in ${CASES:-$ALL}; do
    out=()
    for _ in $(seq "$RUNS"); do
        out+=("$(run "$c" || echo "nan nan")")
        # A reader that takes minutes is timed once (said in the table).
        if awk -v t="${out[0]%% *}" 'BEGIN { exit !(t > 60) }'; then ONCE[$c]=" (1 run)"; break; fi
    done
    T[$c]=$(printf '%s\n' "${out[@]}" | awk '{print $1}' | median)
    B[$c]=$(printf '%s\n' "${out[@]}" | awk '{print $2}' | median)
    echo "$c: ${T[$c]} s ${B[$c]}" >&2
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", b / a; else print "n/a" }'; }
ms() { awk -v a="$1" 'BEGIN { if (a == "" || a == "nan") print "n/a"; else printf "%.1f ms", a * 1000 }'; }
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-python$([ "$TREE" = P ] && echo -P || true).md
{
    echo "# The Python package against Python readers of the same tree ($(date +%Y-%m-%d))"
    echo
    if [ "$TREE" = P ]; then what="tree P (the Python stack of bench/setup.sh, $(tar -tf "$D/tree.tar" | wc -l) entries"; else what="the HCP-like tree of $N entries (bench/gen-tar.py"; fi
    echo "bench/python.sh: $what; $(du -h "$D/tree.tar" | cut -f1) tar," \
         "$(du -h "$D/tree.sheaf" | cut -f1) sheaf image, $(du -h "$D/tree.sqfs" | cut -f1) SquashFS), $(nproc) cores;" \
         "medians of $RUNS fresh processes, times from after imports; page cache dropped before each: $COLD."
    echo
    echo "## Open an image and list its root (target <= 50 ms at 1M entries)"
    echo
    echo "| reader | time | sheaf's speedup |"
    echo "|---|---|---|"
    echo "| sheaf.open + listdir | $(ms "${T[open-sheaf]:-}") | |"
    echo "| ratarmountcore (index built beforehand) | $(ms "${T[open-ratarmount]:-}") | $(ratio "${T[open-sheaf]:-}" "${T[open-ratarmount]:-}") |"
    echo "| PySquashfsImage | $(ms "${T[open-pysquashfs]:-}")${ONCE[open-pysquashfs]:-} | $(ratio "${T[open-sheaf]:-}" "${T[open-pysquashfs]:-}") |"
    echo
    echo "## 10,000 random small files from one process"
    echo
    echo "| reader | time | read_many's speedup | the loop's speedup | target |"
    echo "|---|---|---|---|---|"
    echo "| sheaf read_many | $(ms "${T[read-sheaf-many]:-}") | | | |"
    echo "| sheaf loop of open().read() | $(ms "${T[read-sheaf-loop]:-}") | | | |"
    echo "| ratarmountcore | $(ms "${T[read-ratarmount]:-}")${ONCE[read-ratarmount]:-} | $(ratio "${T[read-sheaf-many]:-}" "${T[read-ratarmount]:-}") | $(ratio "${T[read-sheaf-loop]:-}" "${T[read-ratarmount]:-}") | >= 3x |"
    echo "| fsspec tar:// (index built beforehand) | $(ms "${T[read-fsspec-tar]:-}")${ONCE[read-fsspec-tar]:-} | $(ratio "${T[read-sheaf-many]:-}" "${T[read-fsspec-tar]:-}") | $(ratio "${T[read-sheaf-loop]:-}" "${T[read-fsspec-tar]:-}") | >= 5x |"
    echo "| Python loop over a kernel squashfs mount | $(ms "${T[read-kernel-squashfs]:-}")${ONCE[read-kernel-squashfs]:-} | $(ratio "${T[read-sheaf-many]:-}" "${T[read-kernel-squashfs]:-}") | $(ratio "${T[read-sheaf-loop]:-}" "${T[read-kernel-squashfs]:-}") | >= 1x |"
    echo
    echo "## h5py: a 512x512 hyperslab of a 64 MiB chunked dataset over HTTP (nginx on loopback)"
    echo
    echo "| reader | time | bytes sent by nginx |"
    echo "|---|---|---|"
    echo "| sheaf (image, no node cache) | $(ms "${T[h5-sheaf]:-}") | ${B[h5-sheaf]:-} |"
    echo "| h5py on the raw .h5 through fsspec HTTP | $(ms "${T[h5-fsspec-http]:-}") | ${B[h5-fsspec-http]:-} |"
} > "$OUT"
cat "$OUT"
