#!/usr/bin/env bash
# Does `sheaf merge` pack like `sheaf build`? (issue 54 §3). Builds TREE as a base image,
# commits a small change set (files changed, one removed with a .wh. whiteout, files
# added) as a layer, merges the two, and builds the same merged tree (a copy of TREE with
# the change applied) directly; prints each image's size, codecs, dictionaries and pack
# blocks, and checks that both extract to the merged tree (diff -r).
#
# Usage: bench/merge-packing.sh TREE WORKDIR   (SHEAF: the binary, default target/release/sheaf)
# TREE: tree P of bench/setup.sh if you have it, else e.g. a copy of /usr/lib/python3,
# /usr/lib/python3.11 and /usr/share/doc. WORKDIR gets a copy of TREE and the images.
set -euo pipefail
TREE=$(realpath "$1")
W=$2
SHEAF=${SHEAF:-$(dirname "$0")/../target/release/sheaf}
SHEAF=$(realpath "$SHEAF")
mkdir -p "$W"
W=$(realpath "$W")
rm -rf "$W/upper" "$W/T2" "$W/out-merged" "$W/out-built" "$W"/*.sheaf

# The change set: three files changed, one removed, four added, picked by sorted path.
mapfile -t files < <(cd "$TREE" && find . -type f -size +1k -size -64k | LC_ALL=C sort)
n=${#files[@]}
[ "$n" -ge 100 ] || { echo "TREE has too few files" >&2; exit 1; }
cp -a "$TREE" "$W/T2"
mkdir -p "$W/upper"
for i in 1 2 3; do
    f=${files[$((n * i / 5))]}
    mkdir -p "$W/upper/$(dirname "$f")"
    { cat "$TREE/$f"; echo "# changed by the merge benchmark ($i)"; } > "$W/upper/$f"
    cp "$W/upper/$f" "$W/T2/$f"
done
gone=${files[$((n / 2 + 1))]}
mkdir -p "$W/upper/$(dirname "$gone")"
: > "$W/upper/$(dirname "$gone")/.wh.$(basename "$gone")"
rm "$W/T2/$gone"
mkdir -p "$W/upper/added" "$W/T2/added"
for i in 1 2 3 4; do
    f=${files[$((n * i / 7))]}
    cp "$TREE/$f" "$W/upper/added/new$i"
    cp "$TREE/$f" "$W/T2/added/new$i"
done

t() { local s; s=$(date +%s.%N); "$@"; echo "$(date +%s.%N) - $s" | bc; }
echo "build base:  $(t "$SHEAF" build "$TREE" -o "$W/base.sheaf" -q) s"
echo "commit:      $(t "$SHEAF" commit "$W/upper" -o "$W/layer.sheaf" -q) s"
echo "merge:       $(t "$SHEAF" merge "$W/base.sheaf" "$W/layer.sheaf" -o "$W/merged.sheaf" -q) s"
echo "build T2:    $(t "$SHEAF" build "$W/T2" -o "$W/built.sheaf" -q) s"

summary() {
    "$SHEAF" info --json "$1" | python3 -c '
import json, sys
j = json.load(sys.stdin)
d = [s for s in j["sections"] if s["kind"] == 4]
print("%d bytes  dictionary %s  blocks by codec %s" % (
    j["image_bytes"], "%d B" % d[0]["length"] if d else "none", j.get("blocks_by_codec")))'
}
for img in base layer merged built; do
    printf '%-7s %s\n' "$img" "$(summary "$W/$img.sheaf")"
done
ls -l "$W"/*.sheaf
"$SHEAF" extract "$W/merged.sheaf" -C "$W/out-merged"
"$SHEAF" extract "$W/built.sheaf" -C "$W/out-built"
diff -r --no-dereference "$W/T2" "$W/out-merged" && echo "merged extracts to the merged tree"
diff -r --no-dereference "$W/T2" "$W/out-built" && echo "built extracts to the merged tree"
