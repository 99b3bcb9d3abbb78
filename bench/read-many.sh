#!/usr/bin/env bash
# read_many where it promises (issue 54, section 4): K random small files of
# an N-entry image (the HCP-like tree of bench/gen-tar.py: 12 B..1 KiB files),
# each reader in a fresh process, against ratarmountcore over the same tar.
#   cold: the page cache dropped before each process (echo 3 > drop_caches)
#   warm: the tar, image and index already in the page cache
# Readers: sheaf read_many (threads: one per core), a loop of sheaf
# open().read(), ratarmountcore (SQLiteIndexedTar, its index built
# beforehand, outside the timing). Times from after imports and the open
# (what a data loader's worker pays per batch), medians of RUNS.
# Writes bench/results/DATE-read-many.md.
#
# Usage: bench/read-many.sh   (after make build; installs ratarmountcore
#                              into target/pyenv, for the bench only)
# Env:   N (entries, default 100000), K (files, default 2000), RUNS (default
#        5), TREE (text: bench/gen-tar.py's HCP-like tree, 12 B..1 KiB of
#        text that compresses ~60x; random, the default: the same shape of
#        directories, files of 256 B..16 KiB, half random bytes and half
#        text, as a dataset's thumbnails and sidecars), SHEAF_BENCH_DATA
#        (default /var/tmp/sheaf-bench; the tree is kept in
#        DATA/read-many-TREE-N), EXTRA_BUILD (more `sheaf build` options
#        for a second image, e.g. "--pack-size 64K"; its rows are added).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N=${N:-100000}
K=${K:-2000}
RUNS=${RUNS:-5}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
TREE=${TREE:-random}
D=$DATA/read-many-$TREE-$N
SHEAF=$ROOT/target/release/sheaf
VENV=${SHEAF_PYENV:-$ROOT/target/pyenv}
PYTHON=$VENV/bin/python
die() { echo "bench/read-many.sh: $*" >&2; exit 1; }
[ -x "$SHEAF" ] || die "$SHEAF: run make build first"
"$ROOT/scripts/python.sh" wheel >/dev/null
"$ROOT/scripts/pyenv.sh" "$VENV"
"$PYTHON" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$(ls -t "$ROOT"/target/wheels/sheaf-*-abi3-*.whl | head -1)"
"$PYTHON" -m pip install -q --disable-pip-version-check ratarmountcore

mkdir -p "$D"
if [ ! -s "$D/tree.tar" ]; then
    case "$TREE" in
        text) python3 "$ROOT/bench/gen-tar.py" "$N" > "$D/tree.tar.tmp" ;;
        random) python3 - "$N" "$D/tree.tar.tmp" <<'EOF' ;;
import io, random, sys, tarfile
n, out = int(sys.argv[1]), sys.argv[2]
r = random.Random(54)
words = [b"subject", b"session", b"value", b"0.25", b"label", b"region", b"T1w", b"\n"]
with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as t:
    made, s = 0, 0
    while made < n:
        d = f"sub-{s // 40:04d}/ses-{s % 40:02d}"
        for part in ([d.split("/")[0]] if s % 40 == 0 else []) + [d]:
            ti = tarfile.TarInfo(part); ti.type = tarfile.DIRTYPE; ti.mode = 0o755; ti.mtime = 1_600_000_000
            t.addfile(ti); made += 1
        s += 1
        for i in range(48):
            if made >= n:
                break
            size = int(2 ** r.uniform(8, 14))
            if i % 2:
                data = r.randbytes(size)  # incompressible, as an image's or a model's bytes
                name = f"{d}/img{i:02d}.bin"
            else:
                data = b" ".join(r.choice(words) for _ in range(size // 6))[:size]
                name = f"{d}/meta{i:02d}.txt"
            ti = tarfile.TarInfo(name); ti.size = len(data); ti.mode = 0o644; ti.mtime = 1_600_000_000
            t.addfile(ti, io.BytesIO(data)); made += 1
EOF
        *) die "TREE=$TREE: text or random" ;;
    esac
    mv "$D/tree.tar.tmp" "$D/tree.tar"
fi
[ -s "$D/tree.sheaf" ] && [ "$D/tree.sheaf" -nt "$SHEAF" ] || "$SHEAF" build -q -f "$D/tree.tar" -o "$D/tree.sheaf"
if [ -n "${EXTRA_BUILD:-}" ]; then
    # shellcheck disable=SC2086
    "$SHEAF" build -q -f "$D/tree.tar" -o "$D/extra.sheaf" $EXTRA_BUILD
fi
[ -s "$D/tree.tar.index.sqlite" ] || "$PYTHON" - "$D" <<'EOF' >/dev/null
import sys
from ratarmountcore.mountsource.formats.tar import SQLiteIndexedTar
d = sys.argv[1]
a = SQLiteIndexedTar(f"{d}/tree.tar", writeIndex=True, indexFilePath=f"{d}/tree.tar.index.sqlite")
if hasattr(a, "close"):
    a.close()
EOF
"$PYTHON" - "$D" "$K" <<'EOF'
import random, sys, sheaf
d, k = sys.argv[1], int(sys.argv[2])
files = sheaf.open(f"{d}/tree.sheaf").files()
random.Random(54).shuffle(files)
open(f"{d}/sample.txt", "w").write("\n".join(files[:k]) + "\n")
EOF

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
[ -w /proc/sys/vm/drop_caches ] || die "cold runs need root (echo 3 > /proc/sys/vm/drop_caches)"

# run CASE IMAGE: one fresh process; prints its seconds (open + K reads).
run() {
    "$PYTHON" - "$D" "$1" "$2" 2>/dev/null <<'EOF' | tail -1
import sys, time
d, case, image = sys.argv[1:]
sample = open(f"{d}/sample.txt").read().splitlines()
import sheaf
from ratarmountcore.mountsource.formats.tar import SQLiteIndexedTar
t = time.perf_counter
if case == "sheaf-many":
    s = t(); im = sheaf.open(image); b = im.read_many(sample); e = t()
elif case == "sheaf-loop":
    s = t(); im = sheaf.open(image)
    b = []
    for p in sample:
        with im.open(p) as f: b.append(f.read())
    e = t()
elif case == "ratarmount":
    s = t(); a = SQLiteIndexedTar(f"{d}/tree.tar", indexFilePath=f"{d}/tree.tar.index.sqlite")
    b = []
    for p in sample:
        with a.open(a.lookup("/" + p)) as f: b.append(f.read())
    e = t()
assert len(b) == len(sample) and all(len(x) > 0 for x in b)
print(f"{e - s:.6f}")
EOF
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
range() { sort -g | awk 'NR==1{lo=$1} {hi=$1} END {printf "%.2f-%.2f", lo, hi}'; }
declare -A T R
CASES="sheaf-many sheaf-loop ratarmount"
images=("$D/tree.sheaf")
[ -n "${EXTRA_BUILD:-}" ] && images+=("$D/extra.sheaf")
for mode in cold warm; do
    for img in "${images[@]}"; do
        for c in $CASES; do
            [ "$c" = ratarmount ] && [ "$img" != "$D/tree.sheaf" ] && continue
            key="$mode $(basename "$img" .sheaf) $c"
            [ "$mode" = warm ] && run "$c" "$img" >/dev/null   # fill the cache
            out=()
            for _ in $(seq "$RUNS"); do
                [ "$mode" = cold ] && drop
                out+=("$(run "$c" "$img")")
            done
            T[$key]=$(printf '%s\n' "${out[@]}" | median)
            R[$key]=$(printf '%s\n' "${out[@]}" | range)
            echo "$key: ${T[$key]} s (${R[$key]})" >&2
        done
    done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", b / a; else print "n/a" }'; }
s() { awk -v a="$1" 'BEGIN { printf "%.3f s", a }'; }
OUT=$ROOT/bench/results/$(date +%Y-%m-%d)-read-many$([ "$TREE" = text ] && echo -text || true).md
{
    echo "# read_many: $K random small files of a $N-entry image ($(date +%Y-%m-%d))"
    echo
    if [ "$TREE" = text ]; then what="the HCP-like tree of bench/gen-tar.py ($N entries, files of 12 B..1 KiB of text)"; else what="TREE=random ($N entries in directories of 48 files, 256 B..16 KiB, half random bytes, half text)"; fi
    echo "bench/read-many.sh: $what;" \
         "$(du -h "$D/tree.tar" | cut -f1) tar, $(du -h "$D/tree.sheaf" | cut -f1) sheaf image" \
         "(default build$([ -n "${EXTRA_BUILD:-}" ] && echo "; extra: $EXTRA_BUILD, $(du -h "$D/extra.sheaf" | cut -f1)"));" \
         "$(nproc) cores; each figure the median of $RUNS fresh processes (range in brackets)," \
         "timed from before the open to the last byte; cold: page cache dropped before each process;" \
         "warm: after one unrecorded run. ratarmountcore $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("ratarmountcore"))'), its index built beforehand."
    echo
    echo "| case | reader | time | ratarmountcore / sheaf |"
    echo "|---|---|---|---|"
    for mode in cold warm; do
        for img in "${images[@]}"; do
            b=$(basename "$img" .sheaf)
            for c in $CASES; do
                key="$mode $b $c"
                [ -n "${T[$key]:-}" ] || continue
                r=""
                [ "$c" != ratarmount ] && r=$(ratio "${T[$key]}" "${T["$mode tree ratarmount"]}")
                echo "| $mode | $c ($b) | $(s "${T[$key]}") (${R[$key]}) | $r |"
            done
        done
    done
} > "$OUT"
cat "$OUT"
