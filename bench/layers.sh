#!/usr/bin/env bash
# Layers and writable-overlay benchmark (issue 6). Writes bench/results/DATE-layers.md.
#
# 1. Stack vs merged: tree K split round-robin into 3 layers (every directory is in all
#    three; layer 2 replaces ~0.3% of layer 1's files, layer 3 ~0.3% of layer 2's and
#    whites out ~0.4% of the files below it) mounted as a stack, against the one image
#    `sheaf merge` makes of it. Cold and warm `find . | wc -l`, cold and warm read-all
#    (`tar -cf - . | wc -c`). Target: stack <= 1.2x the merged image's time.
# 2. Lookup cost against the number of layers: `stat` of LOOKUP_N fixed random files of K
#    on a fresh mount, K split into 1, 10 and 100 contiguous slices (layer k holds the
#    k-th slice of the sorted tree, with its parent directories), and K under 99 small
#    unrelated layers. sheaf against ratarmount (pip, in a venv under the data dir) on
#    the same slices as tar archives (indexes made beforehand, outside the timing).
# 3. Writable overlay: dd of DD_MIB MiB in 1 MiB writes to a new file (without and with
#    fsync), untar of 20,000 (and 5,000) small files from tree M, `git init && git add
#    -A -f -- GIT_ADD_PATHS && git commit` in the overlay, and `git status --ignored` on
#    all of tree K (warm, and on a fresh mount after drop_caches) with the same packed
#    repository of K copied into each upper (its index refreshed by a first status);
#    sheaf mount K.sheaf --upper against
#    fuse-overlayfs over the extracted tree (the fair peer), fuse-overlayfs over a sheaf
#    read-only mount (two FUSE hops: what Apptainer users do today), and, as references,
#    kernel overlayfs over the extracted tree and a plain directory.
# "Cold" = fresh mount(s) (new serving processes) after dropping the page cache.
# Medians of RUNS runs, interleaved (the order of the mounts rotates between runs).
#
# Layer tars and images are kept in $SHEAF_BENCH_DATA/layers (about 5 GB) and reused;
# sheaf images are rebuilt when older than the sheaf binary (or REBUILD_SHEAF=1).
#
# Usage: bench/layers.sh           (after bench/setup.sh K M; run as root; ~15 min, of which
#                                   ~3.5 min rebuilding the sheaf images after a new binary;
#                                   ~3 min more the very first time: tars, ratarmount indexes
#                                   and the git repository of K are made once and kept)
# Env:   SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench), RUNS (default 3), PARTS (subset
#        of "stack lookup overlay"), OVL_KINDS (subset of "sheaf fovl-dir fovl-sheaf kovl
#        native"), GIT_KINDS (default "sheaf fovl-dir fovl-sheaf"; kovl can be added),
#        GIT_ADD_PATHS (default "fs net sound arch/x86 arch/arm64", ~10k files; "." = all),
#        LOOKUP_N (default 3000), DD_MIB (default 1024), RATARMOUNT_VENV (default
#        $SHEAF_BENCH_DATA/ratarmount-venv; created with pip if missing),
#        RATARMOUNT_VERSION (pip requirement, default "ratarmount")
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
SHEAF_SRC=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
LD=$DATA/layers
RUNS=${RUNS:-3}
PARTS=${PARTS:-"stack lookup overlay"}
OVL_KINDS=${OVL_KINDS:-"sheaf fovl-dir fovl-sheaf kovl native"}
GIT_KINDS=${GIT_KINDS:-"sheaf fovl-dir fovl-sheaf"}
GIT_ADD_PATHS=${GIT_ADD_PATHS:-"fs net sound arch/x86 arch/arm64"}   # "." for all of K (~2.5 min per kind)
LOOKUP_N=${LOOKUP_N:-3000}
DD_MIB=${DD_MIB:-1024}
VENV=${RATARMOUNT_VENV:-$DATA/ratarmount-venv}
RATARMOUNT_VERSION=${RATARMOUNT_VERSION:-ratarmount}
PYTHON=${PYTHON:-python3}
LAYOUT=v1          # bump when the generated layers change: the cached tars are rebuilt
STAMP=$(date +%Y-%m-%d-%H%M)
OUT=$ROOT/bench/results/$STAMP-layers.md

# Targets
T_STACK=1.2        # 3-layer stack time / merged image time        <=
T_LOOKUP=2         # 100-layer stat time / 1-layer stat time       <=  (linear would be ~100)
T_OVL=1.0          # sheaf overlay time / fuse-overlayfs-over-dir  <   (sheaf faster)

log() { printf '[layers-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
has() { [[ " $1 " == *" $2 "* ]]; }

# ------------------------------------------------------------------------------------------
# preflight
[ "$(id -u)" = 0 ] || die "must run as root (drop_caches, kernel overlayfs, fuse-overlayfs on /)"
[ -x "$SHEAF_SRC" ] || die "$SHEAF_SRC missing: run make build"
[ -f "$DATA/.K.done" ] && [ -d "$DATA/K" ] || die "$DATA/K missing: run bench/setup.sh K M"
command -v "$PYTHON" >/dev/null || die "$PYTHON missing"
command -v fusermount3 >/dev/null || die "fusermount3 missing (apt-get install fuse3)"
command -v findmnt >/dev/null || die "findmnt missing (util-linux)"
if has "$PARTS" overlay; then
    [ -f "$DATA/.M.done" ] && [ -d "$DATA/M" ] || die "$DATA/M missing: run bench/setup.sh M"
    { has "$OVL_KINDS $GIT_KINDS" fovl-dir || has "$OVL_KINDS $GIT_KINDS" fovl-sheaf; } && ! command -v fuse-overlayfs >/dev/null \
        && die "fuse-overlayfs missing (scripts/deps.sh bench, or apt-get install fuse-overlayfs)"
    command -v git >/dev/null || die "git missing"
fi
if has "$PARTS" lookup && [ ! -x "$VENV/bin/ratarmount" ]; then
    log "installing ratarmount into $VENV (pip)"
    "$PYTHON" -m venv "$VENV" || die "cannot create a venv at $VENV (apt-get install python3-venv)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "$RATARMOUNT_VERSION" \
        || die "pip install $RATARMOUNT_VERSION failed"
fi
mkdir -p "$LD" "$ROOT/bench/results"

WORK=$(mktemp -d "$DATA/layers-run.XXXXXX")   # mount points, uppers, logs; removed on exit
LOGS=$WORK/logs
mkdir -p "$LOGS" "$WORK/mnt"
# A private copy of the binary: a rebuild during the run must not mix two versions.
SHEAF=$WORK/sheaf
cp "$SHEAF_SRC" "$SHEAF"
SHEAF_DATE=$(date -r "$SHEAF_SRC" '+%Y-%m-%d %H:%M')
SHEAF_REV=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')
git -C "$ROOT" diff --quiet HEAD -- crates 2>/dev/null || SHEAF_REV="$SHEAF_REV+dirty"

# ------------------------------------------------------------------------------------------
# mounts: every mount point we mount is pushed on MOUNTED and unmounted on exit, last first
MOUNTED=()
is_mounted() { findmnt -n -M "$1" >/dev/null 2>&1; }
wait_gone() { # PID...: wait up to 10 s for the serving processes to exit
    local p i
    for p in "$@"; do
        for i in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    done
}
do_umount() { # MP: unmount whatever is mounted there (and wait for its server to exit)
    local mp=$1 t pids
    is_mounted "$mp" || return 0
    t=$(findmnt -n -o FSTYPE -M "$mp")
    case $t in
        fuse.sheaf) "$SHEAF" umount "$mp" 2>/dev/null || fusermount3 -u -z "$mp" ;;
        fuse*)  pids=$(pgrep -f -- " $mp\$" || true)
                fusermount3 -u "$mp" 2>/dev/null || fusermount3 -u -z "$mp"
                # shellcheck disable=SC2086
                [ -z "$pids" ] || wait_gone $pids ;;
        *)      umount "$mp" 2>/dev/null || umount -l "$mp" ;;
    esac
}
pushed() { MOUNTED+=("$1"); }
cleanup() {
    local i rc=$?
    set +e
    for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do do_umount "${MOUNTED[$i]}"; done
    for i in "$WORK"/mnt/*; do is_mounted "$i" && { log "still mounted: $i"; do_umount "$i"; }; done
    [ -n "${SHORT:-}" ] && { do_umount "$SHORT"; rmdir "$SHORT"; }
    if [ $rc != 0 ] && [ -d "$LOGS" ]; then
        log "failed; logs kept in $DATA/layers-logs-$STAMP"
        cp -r "$LOGS" "$DATA/layers-logs-$STAMP" 2>/dev/null
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now_ns() { date +%s%N; }

# R[key] holds the runs' values (ns) separated by spaces, "fail" for a failed run.
declare -A R ERR
add() { R[$1]="${R[$1]:-} $2"; }
med() { # median of the runs of KEY, or "fail" if any failed, "" if none
    local v=${R[$1]:-}
    [ -n "$v" ] || { echo ""; return; }
    [[ " $v " == *" fail "* ]] && { echo fail; return; }
    printf '%s\n' $v | sort -n | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
# run_timed KEY DIR CMD: run CMD (bash) in DIR, output discarded, append the wall ns to KEY
run_timed() {
    local key=$1 dir=$2 cmd=$3 s e
    s=$(now_ns)
    if ( cd "$dir" && eval "$cmd" ) >/dev/null 2>"$LOGS/last.err"; then
        e=$(now_ns); add "$key" $((e - s))
    else
        add "$key" fail
        ERR[$key]=$(grep -v '^$' "$LOGS/last.err" | head -n 1 | cut -c1-160)
        log "$key: FAILED: ${ERR[$key]}"
        cat "$LOGS/last.err" >> "$LOGS/errors.log"
        return 1
    fi
}
num() { [[ $1 =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; }
f() { # f FMT EXPR a [b]: awk arithmetic on numbers; "fail"/"" pass through
    local fmt=$1 expr=$2 a=${3:-} b=${4:-1}
    num "$a" || { echo "${a:-—}"; return; }
    num "$b" || { echo "${b:-—}"; return; }
    awk -v a="$a" -v b="$b" "BEGIN { printf \"$fmt\", $expr }" 2>/dev/null || echo —
}
s_() { f '%.2f' 'a/1e9' "$1"; }                 # ns -> s
ratio() { num "$1" && num "$2" && awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "—" }' || echo "—"; }
verdict() { # VALUE le|lt|ge TARGET
    num "$1" || { echo "n/a"; return; }
    awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN { ok = op == "le" ? v <= t : op == "lt" ? v < t : v >= t; print ok ? "met" : "MISSED" }'
}
stats_json() { "$SHEAF" stats "$1" --json 2>/dev/null || echo '{}'; }
# One line from a `sheaf stats --json`: op counts and mean latencies, bytes read.
stats_line() {
    "$PYTHON" -c '
import json, sys
try: s = json.load(open(sys.argv[1]))
except Exception: print("(no stats)"); sys.exit()
ops = s.get("ops", {})
parts = ["%s %d × %.0f µs" % (k, v.get("count", 0), v.get("mean_us", 0)) for k, v in sorted(ops.items(), key=lambda kv: -kv[1].get("count", 0) * kv[1].get("mean_us", 0)) if v.get("count")]
extra = []
for k in ("bytes_read", "bytes_served", "copy_ups"):
    if k in s: extra.append("%s %s" % (k, s[k]))
print("; ".join(parts[:7]) + ((" — " + ", ".join(extra)) if extra else ""))' "$1"
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$(date +%s)
log "sheaf=$SHEAF_SRC data=$DATA parts='$PARTS' runs=$RUNS work=$WORK"

# ------------------------------------------------------------------------------------------
# layer data: lists, staged replacements and whiteouts, tars (kept in $LD and reused)
if [ "$(cat "$LD/.layout" 2>/dev/null)" != "$LAYOUT" ]; then
    log "generating the layer lists from $DATA/K (layout $LAYOUT)"
    rm -rf "$LD/lists" "$LD/stage" "$LD/tar" "$LD/sheaf" "$LD/.layout"
    "$PYTHON" - "$DATA/K" "$LD" "$LOOKUP_N" <<'EOF'
import os, random, shutil, sys
K, LD, LOOKUP_N = sys.argv[1], sys.argv[2], int(sys.argv[3])
entries = []                    # (path relative to K, is_dir), pre-order, names sorted
def walk(rel):
    with os.scandir(os.path.join(K, rel) if rel else K) as it:
        ents = sorted(it, key=lambda e: e.name)
    for e in ents:
        r = rel + "/" + e.name if rel else e.name
        if "\n" in r:
            sys.exit("newline in a name under K: %r" % r)
        d = e.is_dir(follow_symlinks=False)
        entries.append((r, d))
        if d:
            walk(r)
walk("")
def ancestors(r):
    p = r.split("/")
    return ["/".join(p[:i]) for i in range(1, len(p))]
def write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(l + "\n" for l in lines))
lists = os.path.join(LD, "lists")
# Contiguous slices: layer k holds entries [k*n/N, (k+1)*n/N) of the pre-order, plus the
# parent directories of what it holds.
for N in (1, 10, 100):
    n = len(entries)
    for k in range(N):
        seen, out = set(), []
        for r, d in entries[k * n // N:(k + 1) * n // N]:
            for a in ancestors(r) + [r]:
                if a not in seen:
                    seen.add(a); out.append("./" + a)
        write(os.path.join(lists, "n%d" % N, "L%03d.list" % k), out)
# Three layers, round-robin: non-directory j goes to layer j % 3, so every directory with
# files is in all three. Layer 2 replaces some of layer 1's files, layer 3 some of layer
# 2's, and whites out some files of layers 1 and 2.
files = [r for r, d in entries if not d]
layer_of = {r: j % 3 for j, r in enumerate(files)}
isreg = lambda r: os.path.isfile(os.path.join(K, r)) and not os.path.islink(os.path.join(K, r))
repl = {1: [r for j, r in enumerate(files) if j % 3 == 0 and j % 101 == 0 and isreg(r)],
        2: [r for j, r in enumerate(files) if j % 3 == 1 and j % 101 == 1 and isreg(r)]}
replaced = set(repl[1]) | set(repl[2])
wh = [r for j, r in enumerate(files) if j % 3 in (0, 1) and j % 157 == 7 and r not in replaced]
stage = os.path.join(LD, "stage", "s3")
staged = {0: [], 1: [], 2: []}
for L in (1, 2):
    for r in repl[L]:
        dst = os.path.join(stage, str(L + 1), r)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(os.path.join(K, r), "rb") as s, open(dst, "wb") as o:
            o.write(s.read()); o.write(b"\n/* replaced by layer %d */\n" % (L + 1))
        shutil.copystat(os.path.join(K, r), dst)
        staged[L].append(r)
for r in wh:
    dn, bn = os.path.split(r)
    w = (dn + "/" if dn else "") + ".wh." + bn
    dst = os.path.join(stage, "3", w)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    open(dst, "wb").close(); os.chmod(dst, 0o644); os.utime(dst, (1700000000, 1700000000))
    staged[2].append(w)
dirs_of = {L: set() for L in range(3)}
for r in files:
    dirs_of[layer_of[r]].update(ancestors(r))
for L in range(3):
    for r in staged[L]:
        dirs_of[L].update(ancestors(r))
with_files = dirs_of[0] | dirs_of[1] | dirs_of[2]
for L in range(3):
    out = []
    for r, d in entries:
        if d:
            if r in dirs_of[L] or (L == 0 and r not in with_files):
                out.append("./" + r)
        elif layer_of[r] == L:
            out.append("./" + r)
    if staged[L]:
        out.append("-C " + os.path.join(stage, str(L + 1)))
        out += ["./" + r for r in staged[L]]
    write(os.path.join(lists, "s3", "L%d.list" % (L + 1)), out)
# 99 small layers that have nothing to do with K: /opt/pkgNN and /etc/pkgNN.conf.
for i in range(1, 100):
    base = os.path.join(LD, "stage", "small", "S%02d" % i)
    for p, body in (("opt/pkg%02d/bin/tool%02d" % (i, i), "#!/bin/sh\necho %d\n" % i),
                    ("opt/pkg%02d/lib/lib%02d.txt" % (i, i), "library %d\n" % i * 20),
                    ("opt/pkg%02d/share/doc/README" % i, "package %d\n" % i),
                    ("etc/pkg%02d.conf" % i, "value = %d\n" % i)):
        dst = os.path.join(base, p)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "w") as o:
            o.write(body)
    for dp, dns, fns in os.walk(base):
        for n in dns + fns:
            os.utime(os.path.join(dp, n), (1700000000, 1700000000))
    os.utime(base, (1700000000, 1700000000))
# The lookup list: LOOKUP_N random non-directories of K, in random order.
rnd = random.Random(42)
write(os.path.join(lists, "lookup.txt"), rnd.sample(files, min(LOOKUP_N, len(files))))
# Batches of directories (<= 15000 files each) for `git add` in several steps.
count = {}
for r in files:
    for a in [""] + ancestors(r):
        count[a] = count.get(a, 0) + 1
units = []
def split(d):
    if count.get(d, 0) <= 15000 and d:
        units.append((d, count[d])); return
    pre = d + "/" if d else ""
    for r, isd in entries:
        if r.startswith(pre) and "/" not in r[len(pre):]:
            if isd:
                if count.get(r): split(r)
            else:
                units.append((r, 1))
split("")
batches, cur, n = [], [], 0
for u, c in units:
    if n + c > 15000 and cur:
        batches.append(cur); cur, n = [], 0
    cur.append(u); n += c
batches.append(cur)
for i, b in enumerate(batches):
    write(os.path.join(lists, "git", "B%02d.list" % i), b)
print("%d entries, %d files; s3: %d + %d replaced, %d whiteouts; %d git batches"
      % (len(entries), len(files), len(repl[1]), len(repl[2]), len(wh), len(batches)), file=sys.stderr)
EOF
    echo "$LAYOUT" > "$LD/.layout"
fi
LOOKUP=$LD/lists/lookup.txt
[ "$(wc -l < "$LOOKUP")" = "$LOOKUP_N" ] || die "$LOOKUP has not $LOOKUP_N lines: remove $LD/.layout to regenerate"


make_tars() { # the archives of one set, from K (or the staged small layers)
    local set=$1 l name
    [ -f "$LD/tar/.$set.done" ] && return 0
    log "writing the $set tar archives"
    rm -rf "$LD/tar/$set"; mkdir -p "$LD/tar/$set"
    if [ "$set" = small ]; then
        for l in "$LD"/stage/small/S*; do
            tar -cf "$LD/tar/small/$(basename "$l").tar" --numeric-owner -C "$l" .
        done
    else
        for l in "$LD/lists/$set"/*.list; do
            name=$(basename "$l" .list)
            tar -cf "$LD/tar/$set/$name.tar" --no-recursion --numeric-owner -C "$DATA/K" -T "$l"
        done
    fi
    touch "$LD/tar/.$set.done"
}
fresh() { # fresh IMAGE DEP...: IMAGE exists and is newer than the sheaf binary and DEPs
    local img=$1 d; shift
    [ -f "$img" ] && [ "${REBUILD_SHEAF:-0}" != 1 ] && [ "$img" -nt "$SHEAF_SRC" ] || return 1
    for d in "$@"; do [ "$img" -nt "$d" ] || return 1; done
}
sheaf_images() { # sheaf images of a set of tars
    local set=$1 t img n=0
    mkdir -p "$LD/sheaf/$set"
    for t in "$LD/tar/$set"/*.tar; do
        img=$LD/sheaf/$set/$(basename "$t" .tar).sheaf
        fresh "$img" "$t" && continue
        [ $n = 0 ] && log "building the sheaf images of $set"
        n=$((n + 1))
        "$SHEAF" build -q --force "$t" -o "$img" 2>>"$LOGS/build.log" || die "sheaf build $t failed: $(tail -n 2 "$LOGS/build.log")"
    done
}
T_PREP0=$(date +%s)
need_n1=0; has "$PARTS" lookup && need_n1=1; has "$PARTS" overlay && need_n1=1
if [ $need_n1 = 1 ]; then make_tars n1; sheaf_images n1; fi
if has "$PARTS" lookup; then
    for s in n10 n100 small; do make_tars "$s"; sheaf_images "$s"; done
fi
KIMG=$LD/sheaf/n1/L000.sheaf
if has "$PARTS" stack; then
    mkdir -p "$LD/sheaf/s3"
    for i in 1 2 3; do
        img=$LD/sheaf/s3/L$i.sheaf
        fresh "$img" "$LD/lists/s3/L$i.list" && continue
        log "building stack layer $i of 3"
        tar -cf - --no-recursion --numeric-owner -C "$DATA/K" -T "$LD/lists/s3/L$i.list" \
            | "$SHEAF" build -q --force - -o "$img" 2>>"$LOGS/build.log" || die "building $img failed: $(tail -n 2 "$LOGS/build.log")"
    done
    M3=$LD/sheaf/s3/merged.sheaf
    if ! fresh "$M3" "$LD"/sheaf/s3/L{1,2,3}.sheaf; then
        if "$SHEAF" merge --help >/dev/null 2>&1; then
            log "sheaf merge of the 3 layers"
            "$SHEAF" merge -q --force "$LD"/sheaf/s3/L{1,2,3}.sheaf -o "$M3" 2>>"$LOGS/build.log" || die "sheaf merge failed: $(tail -n 2 "$LOGS/build.log")"
            MERGE_HOW="sheaf merge"
        else
            log "no sheaf merge: building the merged image from the union mount"
            mp=$WORK/mnt/merge; mkdir -p "$mp"
            "$SHEAF" mount "$LD"/sheaf/s3/L{1,2,3}.sheaf "$mp"; pushed "$mp"
            "$SHEAF" build -q --force "$mp" -o "$M3"
            do_umount "$mp"
            MERGE_HOW="sheaf build of the union mount"
        fi
    fi
    MERGE_HOW=${MERGE_HOW:-"sheaf merge (cached)"}
fi
T_PREP1=$(date +%s)

# ------------------------------------------------------------------------------------------
# part 1: 3-layer stack vs the merged image
if has "$PARTS" stack; then
    MP=$WORK/mnt/stack; mkdir -p "$MP"
    mount_s3() { # stack|merged
        if [ "$1" = stack ]; then "$SHEAF" mount "$LD"/sheaf/s3/L{1,2,3}.sheaf "$MP"
        else "$SHEAF" mount "$M3" "$MP"; fi
        pushed "$MP"
    }
    # The two views must be equal: names, types, sizes, modes, mtimes, link targets
    # (directory sizes are compared apart: they are not the same thing in every filesystem).
    for k in stack merged; do
        mount_s3 $k
        (cd "$MP" && find . \( -type d -printf '%p d - %m %T@\n' \) -o -printf '%p %y %s %m %T@ %l\n' | LC_ALL=C sort) > "$LOGS/view.$k"
        (cd "$MP" && find . -type d -printf '%p %s\n' | LC_ALL=C sort) > "$LOGS/dirsize.$k"
        R[s3,$k,entries]=$(wc -l < "$LOGS/view.$k")
        do_umount "$MP"
    done
    diff "$LOGS/view.stack" "$LOGS/view.merged" > "$LOGS/view.diff" || true
    if [ ! -s "$LOGS/view.diff" ]; then VIEWS="equal"
    else VIEWS="DIFFERENT ($(grep -c '^[<>]' "$LOGS/view.diff") lines of \`find -printf\` differ; first: \`$(grep '^[<>]' "$LOGS/view.diff" | sed -n 1,2p | tr '\n' ' ')\`)"
    fi
    DIRSIZES=$(diff "$LOGS/dirsize.stack" "$LOGS/dirsize.merged" | grep -c '^<' || true)
    log "stack: views $VIEWS (${R[s3,stack,entries]} / ${R[s3,merged,entries]} entries)"
    for r in $(seq "$RUNS"); do
        order="stack merged"; [ $((r % 2)) = 0 ] && order="merged stack"
        for k in $order; do
            log "stack run $r/$RUNS: $k"
            do_umount "$MP"; drop_caches; mount_s3 $k
            run_timed "s3,$k,find_cold" "$MP" 'find . | wc -l' || true
            run_timed "s3,$k,find_warm" "$MP" 'find . | wc -l' || true
            do_umount "$MP"; drop_caches; mount_s3 $k
            run_timed "s3,$k,read_cold" "$MP" 'tar -cf - . | wc -c' || true
            [ "$r" = "$RUNS" ] && stats_json "$MP" > "$LOGS/stats.s3.$k.json"
            run_timed "s3,$k,read_warm" "$MP" 'tar -cf - . | wc -c' || true
            do_umount "$MP"
        done
    done
    R[s3,bytes]=$(du -s --apparent-size -B1 "$DATA/K" | cut -f1)
fi

# ------------------------------------------------------------------------------------------
# part 2: lookup cost with 1, 10, 100 layers; sheaf vs ratarmount
LSETS="1 10 100 b99"
set_tars() { # the archives of a set, bottom first
    case $1 in
        1|10|100) ls "$LD/tar/n$1"/*.tar ;;
        b99) echo "$LD/tar/n1/L000.tar"; ls "$LD/tar/small"/*.tar ;;
    esac
}
set_imgs() { set_tars "$1" | sed "s|^$LD/tar/|$LD/sheaf/|; s|\.tar\$|.sheaf|"; }
RAT=("$VENV/bin/ratarmount" --index-minimum-file-count 0)
SHORT=""
mount_lookup() { # TOOL SET MP
    local tool=$1 set=$2 mp=$3 i
    mapfile -t srcs < <(if [ "$tool" = sheaf ]; then set_imgs "$set"; else set_tars "$set"; fi)
    if [ "$tool" = sheaf ]; then
        # sheaf puts every layer's path in the mount's source string: past ~4000 bytes the
        # kernel refuses the mount (EINVAL). Then mount through a short bind-mounted path.
        if [ -z "${R[lk,$set,longfail]:-}" ] && "$SHEAF" mount "${srcs[@]}" "$mp" 2>"$LOGS/mount.err"; then :
        else
            if [ -z "${R[lk,$set,longfail]:-}" ]; then
                R[lk,$set,longfail]=$(tail -n 1 "$LOGS/mount.err")
                R[lk,$set,srclen]=$(printf '%s:' "${srcs[@]}" | wc -c)
                log "sheaf mount of the $set-layer set failed (${R[lk,$set,longfail]}); using paths under a short bind mount"
            fi
            if [ -z "$SHORT" ]; then
                SHORT=$(mktemp -d /tmp/lyr.XXXX); mount --bind "$LD/sheaf" "$SHORT"; pushed "$SHORT"
            fi
            "$SHEAF" mount "${srcs[@]/#$LD\/sheaf/$SHORT}" "$mp"
        fi
    else
        "${RAT[@]}" "${srcs[@]}" "$mp" >>"$LOGS/ratarmount.log" 2>&1
        for i in $(seq 600); do is_mounted "$mp" && break; sleep 0.1; done
        is_mounted "$mp" || die "ratarmount did not mount $set (see $LOGS/ratarmount.log)"
    fi
    pushed "$mp"
}
if has "$PARTS" lookup; then
    MP=$WORK/mnt/lookup; mkdir -p "$MP"
    # sheaf: a first mount of each set (untimed; finds out if the paths are too long).
    for s in $LSETS; do mount_lookup sheaf "$s" "$MP"; do_umount "$MP"; done
    # ratarmount writes its indexes beside the archives on the first mount: do it now.
    for s in $LSETS; do
        if [ ! -f "$LD/tar/.rat-index.$s" ] || [ -n "$(find "$LD/tar" -name '*.tar' -newer "$LD/tar/.rat-index.$s" | head -n 1)" ]; then
            log "lookup: ratarmount indexes of set $s (untimed)"
            s0=$(now_ns); mount_lookup ratarmount "$s" "$MP"; s1=$(now_ns); do_umount "$MP"
            R[rat,$s,index_s]=$(f '%.1f' 'a/1e9' $((s1 - s0)))
            touch "$LD/tar/.rat-index.$s"
        fi
    done
    for r in $(seq "$RUNS"); do
        order="sheaf ratarmount"; [ $((r % 2)) = 0 ] && order="ratarmount sheaf"
        for s in $LSETS; do
            for t in $order; do
                log "lookup run $r/$RUNS: $t, $s layers"
                do_umount "$MP"
                s0=$(now_ns); mount_lookup "$t" "$s" "$MP"; s1=$(now_ns)
                add "lk,$t,$s,mount" $((s1 - s0))
                run_timed "lk,$t,$s,stat" "$MP" "xargs -a '$LOOKUP' -d '\\n' stat --printf=''" || true
                [ "$t" = sheaf ] && [ "$r" = "$RUNS" ] && stats_json "$MP" > "$LOGS/stats.lk.$s.json"
                do_umount "$MP"
            done
        done
    done
fi

# ------------------------------------------------------------------------------------------
# part 3: writable overlay
ovl_mount() { # KIND MP UPPER WORKDIR
    local k=$1 mp=$2 up=$3 wd=$4
    mkdir -p "$mp" "$up" "$wd"
    case $k in
        sheaf)      "$SHEAF" mount "$KIMG" "$mp" --upper "$up" ;;
        fovl-dir)   fuse-overlayfs -o "lowerdir=$DATA/K,upperdir=$up,workdir=$wd" "$mp" 2>>"$LOGS/fovl.log" ;;
        fovl-sheaf) mkdir -p "$mp.lower"
                    "$SHEAF" mount "$KIMG" "$mp.lower"; pushed "$mp.lower"
                    fuse-overlayfs -o "lowerdir=$mp.lower,upperdir=$up,workdir=$wd" "$mp" 2>>"$LOGS/fovl.log" ;;
        kovl)       mount -t overlay overlay -o "lowerdir=$DATA/K,upperdir=$up,workdir=$wd" "$mp" ;;
        native)     mount --bind "$up" "$mp" ;;
    esac
    pushed "$mp"
}
ovl_umount() { do_umount "$1"; [ -d "$1.lower" ] && do_umount "$1.lower"; return 0; }
ovl_pid() { # the serving process of a sheaf overlay (for its fd count)
    server_pid "sheaf mount .* $1 --upper"
}
rotate() { # rotate N WORDS...: the words, starting at the N-th (mod count)
    local n=$1; shift; local words=("$@") i
    for ((i = 0; i < ${#words[@]}; i++)); do printf '%s ' "${words[$(( (i + n) % ${#words[@]} ))]}"; done
}
GITC=(git -c user.name=bench -c user.email=bench@localhost -c gc.auto=0 -c maintenance.auto=0)
GIT_STATUS='git status --porcelain --ignored'
if has "$PARTS" overlay; then
    # the small files: 20 (and 5) directories x 1000 files of 0-200 bytes from tree M
    # shellcheck disable=SC2046
    tar -cf "$WORK/small20k.tar" -C "$DATA/M" $(cd "$DATA/M" && ls | head -n 20)
    # shellcheck disable=SC2046
    tar -cf "$WORK/small5k.tar" -C "$DATA/M" $(cd "$DATA/M" && ls | head -n 5)
    read -r -a KINDS <<< "$OVL_KINDS"
    for r in $(seq "$RUNS"); do
        for k in $(rotate $((r - 1)) "${KINDS[@]}"); do
            log "overlay run $r/$RUNS: $k writes"
            for test in dd dd_fsync small20k small5k; do
                mp=$WORK/mnt/w-$k; up=$WORK/up/w-$k; wd=$WORK/wd/w-$k
                rm -rf "$up" "$wd"; ovl_mount "$k" "$mp" "$up" "$wd"
                case $test in
                    dd)       run_timed "ov,$k,$test" "$mp" "dd if=/dev/zero of=big bs=1M count=$DD_MIB status=none" || true ;;
                    dd_fsync) run_timed "ov,$k,$test" "$mp" "dd if=/dev/zero of=big bs=1M count=$DD_MIB conv=fsync status=none" || true ;;
                    small*)   if ! run_timed "ov,$k,$test" "$mp" "tar -xf '$WORK/$test.tar'"; then
                                  R[ov,$k,$test,made]=$(find "$up" -type f | wc -l)
                                  if [ "$k" = sheaf ] && p=$(ovl_pid "$mp") && [ -n "$p" ]; then
                                      R[ov,$k,$test,fds]="$(ls "/proc/$p/fd" | wc -l) open fds of $(awk '/open files/ { print $4 }' "/proc/$p/limits")"
                                  fi
                              fi ;;
                esac
                [ "$k" = sheaf ] && [ "$r" = "$RUNS" ] && stats_json "$mp" > "$LOGS/stats.ov.$test.json"
                # Unlinked before unmounting, the dirty pages of big are dropped, not written
                # back (kernel overlayfs syncs the upper filesystem when unmounted).
                rm -f "$mp/big"
                ovl_umount "$mp"; rm -rf "$up" "$wd"; sync
            done
        done
    done

    # git 1: `git init && git add -A -f && git commit` once in each overlay (fresh upper).
    for k in $GIT_KINDS; do
        mp=$WORK/mnt/a-$k; up=$WORK/up/a-$k; wd=$WORK/wd/a-$k
        rm -rf "$up" "$wd"; ovl_mount "$k" "$mp" "$up" "$wd"
        log "git: $k: git init && git add -A -f -- $GIT_ADD_PATHS && git commit (once)"
        if ! run_timed "git,$k,add" "$mp" "git init -q && ${GITC[*]} add -A -f -- $GIT_ADD_PATHS && ${GITC[*]} commit -q -m base"; then
            ERR[git,$k,add]=$(grep -m 1 -E 'error|fatal' "$LOGS/last.err" | cut -c1-160 || true)
            R[git,$k,objs]=$(find "$up/.git/objects" -type f 2>/dev/null | wc -l)
            if [ "$k" = sheaf ] && p=$(ovl_pid "$mp") && [ -n "$p" ]; then
                R[git,$k,fds]="$(ls "/proc/$p/fd" | wc -l) open descriptors (limit $(awk '/open files/ { print $4 }' "/proc/$p/limits"))"
            fi
        fi
        R[git,$k,gitdir]=$(du -s -B1 "$up/.git" 2>/dev/null | cut -f1 || true)
        ovl_umount "$mp"; rm -rf "$up" "$wd"
    done
    # git 2: status. Every overlay gets the same repository of K (made once on the plain
    # tree, objects packed, cached in $LD/git) copied into its upper directory; the first
    # status refreshes the index (inode numbers and ctimes differ: every file is hashed).
    if [ ! -f "$LD/git/.done" ]; then
        log "git: preparing a packed repository of K (cached in $LD/git)"
        rm -rf "$LD/git"; mkdir -p "$LD/git"
        G=("${GITC[@]}" --git-dir="$LD/git/dot-git" --work-tree="$DATA/K")
        # (git init records --work-tree as core.worktree: unset, or status would look at K itself)
        { "${G[@]}" init -q && "${G[@]}" config --unset core.worktree && "${G[@]}" add -A -f && "${G[@]}" commit -q -m base \
            && "${G[@]}" repack -a -d -q --window=0; } >>"$LOGS/git.prep.log" 2>&1 \
            || die "preparing the git repository failed: $(tail -n 2 "$LOGS/git.prep.log")"
        touch "$LD/git/.done"
    fi
    for k in $GIT_KINDS; do
        mp=$WORK/mnt/g-$k; up=$WORK/up/g-$k; wd=$WORK/wd/g-$k
        rm -rf "$up" "$wd"; mkdir -p "$up"
        cp -a "$LD/git/dot-git" "$up/.git"
        git --git-dir="$up/.git" config --unset core.worktree || true
        ovl_mount "$k" "$mp" "$up" "$wd"
        log "git: $k: first status (index refresh)"
        if run_timed "git,$k,refresh" "$mp" "$GIT_STATUS"; then
            R[git,$k,tracked]=$(cd "$mp" && git ls-files | wc -l) || true
        else
            R[git,$k,broken]=1
        fi
    done
    read -r -a GK <<< "$GIT_KINDS"
    for r in $(seq "$RUNS"); do
        for k in $(rotate $((r - 1)) "${GK[@]}"); do
            [ -z "${R[git,$k,broken]:-}" ] || continue
            log "git status run $r/$RUNS: $k"
            mp=$WORK/mnt/g-$k; up=$WORK/up/g-$k; wd=$WORK/wd/g-$k
            ovl_umount "$mp"; drop_caches; ovl_mount "$k" "$mp" "$up" "$wd"
            run_timed "git,$k,status_cold" "$mp" "$GIT_STATUS" || true
            run_timed "git,$k,status_warm" "$mp" "$GIT_STATUS" || true
            [ "$k" = sheaf ] && [ "$r" = "$RUNS" ] && stats_json "$mp" > "$LOGS/stats.git.json"
        done
    done
    for k in $GIT_KINDS; do ovl_umount "$WORK/mnt/g-$k"; done
fi
T1=$(date +%s)

# ------------------------------------------------------------------------------------------
# report
ver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo '?'; }
mb() { f '%.1f' 'a/1e6' "$1"; }
sz() { [ -f "$1" ] && mb "$(stat -c %s "$1")" || echo —; }
sumsz() { local t=0 x; for x in "$@"; do [ -f "$x" ] && t=$((t + $(stat -c %s "$x"))); done; mb "$t"; }
{
    echo "# sheaf layers and overlay benchmark, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "Machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2/1048576 }' /proc/meminfo), kernel $(uname -r), $(findmnt -n -o FSTYPE -T "$DATA") under $DATA."
    echo "sheaf $SHEAF_REV ($("$SHEAF" --version 2>/dev/null | head -n 1), binary of $SHEAF_DATE, copied at the start); fuse-overlayfs $(ver fuse-overlayfs); ratarmount $("$VENV/bin/ratarmount" --version 2>/dev/null | awk '/^ratarmount / { print $2; exit }') (pip, $("$VENV/bin/python" --version 2>&1)); git $(git --version | awk '{ print $3 }'); tar $(tar --version | awk 'NR == 1 { print $4 }')."
    echo "Medians of $RUNS interleaved runs (the order of the mounts alternates between runs); times in seconds."
    echo "\"Cold\" = fresh mount (new serving process) after \`echo 3 > /proc/sys/vm/drop_caches\`."
    echo "Caveat: a 2-core VM shared with other work (load average $LOAD0 at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end);"
    echo "figures drift by ±10–20% between runs; ratios within one run are the figures to read."
    echo "Total $((T1 - T0)) s, of which $((T_PREP1 - T_PREP0)) s preparing layers (tars and images are cached in \`$LD\`)."

    if has "$PARTS" stack; then
        echo
        echo "## 1. Three-layer stack against the merged image (tree K)"
        echo
        echo "Tree K ($(mb "${R[s3,bytes]}") MB) split round-robin into 3 layers (every directory with files is in all"
        echo "three); layer 2 replaces $(find "$LD/stage/s3/2" -type f | wc -l) files of layer 1, layer 3 replaces $(find "$LD/stage/s3/3" -type f ! -name '.wh.*' | wc -l) of layer 2's and whites out"
        echo "$(find "$LD/stage/s3/3" -name '.wh.*' | wc -l) files of layers 1–2. Layers $(sumsz "$LD"/sheaf/s3/L{1,2,3}.sheaf) MB in all; merged image ($MERGE_HOW) $(sz "$M3") MB."
        echo "Views: $VIEWS (${R[s3,stack,entries]} entries stacked, ${R[s3,merged,entries]} merged; \`find -printf '%p %y %s %m %T@ %l'\`);"
        echo "directory st_size differs in $DIRSIZES of $(wc -l < "$LOGS/dirsize.stack") directories (a stacked directory's st_size is not the merged directory's)."
        echo
        echo "| measure | merged image s | 3-layer stack s | stack / merged | target | verdict |"
        echo "|---|---:|---:|---:|---|---|"
        for m in find_cold:"find, cold" find_warm:"find, warm" read_cold:"read-all (tar \| wc -c), cold" read_warm:"read-all, warm"; do
            key=${m%%:*}; a=$(med "s3,merged,$key"); b=$(med "s3,stack,$key"); x=$(ratio "$b" "$a")
            echo "| ${m#*:} | $(s_ "$a") | $(s_ "$b") | $x | ≤ $T_STACK | $(verdict "$x" le $T_STACK) |"
        done
        a=$(med s3,merged,read_cold); b=$(med s3,stack,read_cold)
        echo
        echo "Cold read-all throughput: merged $(f '%.0f' 'b/(a/1e9)/1e6' "$a" "${R[s3,bytes]}") MB/s, stack $(f '%.0f' 'b/(a/1e9)/1e6' "$b" "${R[s3,bytes]}") MB/s."
        echo "\`sheaf stats\` after a cold read-all (ops by total time: count × mean):"
        echo "- merged: $(stats_line "$LOGS/stats.s3.merged.json")"
        echo "- stack: $(stats_line "$LOGS/stats.s3.stack.json")"
    fi

    if has "$PARTS" lookup; then
        echo
        echo "## 2. Lookup cost against the number of layers"
        echo
        echo "\`xargs stat\` of $LOOKUP_N fixed random files of tree K on a fresh mount (image/archive files warm in the page"
        echo "cache, so this is the cost of lookups, not of the disk). 1/10/100: K cut into that many contiguous slices of"
        echo "its sorted tree (each layer holds its slice and the slice's parent directories; the stack is K). b99: K"
        echo "with 99 small unrelated layers (/opt/pkgNN, /etc/pkgNN.conf) on top, so every looked-up path is in the bottom layer."
        echo "ratarmount: the same layers as tar archives, union-mounted; its SQLite indexes were written beforehand"
        echo "(untimed$(for s in $LSETS; do [ -n "${R[rat,$s,index_s]:-}" ] && printf ', %s: %s s' "$s" "${R[rat,$s,index_s]}"; done)). Mount = until the mount command returns and the mount is there."
        echo "Images: $(for s in $LSETS; do mapfile -t im < <(set_imgs "$s"); printf '%s: %s MB; ' "$s" "$(sumsz "${im[@]}")"; done)"
        echo
        echo "| layers | sheaf stat s | µs/file | × 1 layer | ratarmount stat s | µs/file | × 1 layer | ratarmount / sheaf | mount ms sheaf / ratarmount |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
        for s in $LSETS; do
            a=$(med "lk,sheaf,$s,stat"); b=$(med "lk,ratarmount,$s,stat")
            echo "| $s | $(s_ "$a") | $(f '%.0f' 'a/1e3/b' "$a" "$LOOKUP_N") | $(ratio "$a" "$(med lk,sheaf,1,stat)") | $(s_ "$b") | $(f '%.0f' 'a/1e3/b' "$b" "$LOOKUP_N") | $(ratio "$b" "$(med lk,ratarmount,1,stat)") | $(ratio "$b" "$a") | $(f '%.0f' 'a/1e6' "$(med "lk,sheaf,$s,mount")") / $(f '%.0f' 'a/1e6' "$(med "lk,ratarmount,$s,mount")") |"
        done
        echo
        echo "| target | value | verdict |"
        echo "|---|---:|---|"
        for s in 100 b99; do
            x=$(ratio "$(med "lk,sheaf,$s,stat")" "$(med lk,sheaf,1,stat)")
            echo "| sheaf, $s layers: stat time ≤ $T_LOOKUP× the 1-layer time (not linear in layers; bar chosen here — linear would be ~100×; ratarmount is published at 6–10×) | $x | $(verdict "$x" le $T_LOOKUP) |"
        done
        echo
        for s in $LSETS; do
            [ -n "${R[lk,$s,longfail]:-}" ] && echo "- **sheaf mount of the $s-layer set with the layers' real paths (${R[lk,$s,srclen]} bytes of paths) failed:** \`${R[lk,$s,longfail]}\`; measured with the same images through a short bind-mounted path."
        done
        echo
        echo "\`sheaf stats\` of the last run (lookups):"
        for s in $LSETS; do echo "- $s: $(stats_line "$LOGS/stats.lk.$s.json")"; done
    fi

    if has "$PARTS" overlay; then
        echo
        echo "## 3. Writable overlay on tree K"
        echo
        echo "Kinds: **sheaf** = \`sheaf mount K.sheaf MP --upper DIR\`; **fovl-dir** = \`fuse-overlayfs -o lowerdir=K,upperdir=U,workdir=W\`"
        echo "with K the extracted tree on ext4 (the fair peer); **fovl-sheaf** = the same with lowerdir a read-only \`sheaf mount\`"
        echo "of K.sheaf (two FUSE hops: Apptainer's way today); references: **kovl** = kernel overlayfs over the extracted tree"
        echo "(root only), **native** = a plain ext4 directory. Uppers on the same ext4. Each write test on a fresh mount and upper."
        echo "dd: \`dd if=/dev/zero of=big bs=1M count=$DD_MIB\` (without fsync: until write() returns; with \`conv=fsync\`)."
        echo "small files: \`tar -xf\` of 20 (5) directories × 1000 files of 0–200 bytes from tree M."
        echo
        printf '| measure |'; for k in $OVL_KINDS; do printf ' %s |' "$k"; done; echo ' sheaf / fovl-dir | sheaf / fovl-sheaf | target | verdict |'
        printf '|---|'; for k in $OVL_KINDS; do printf -- '---:|'; done; echo '---:|---:|---|---|'
        for m in dd:"dd $DD_MIB MiB, no fsync: s" dd_fsync:"dd $DD_MIB MiB + fsync: s" small20k:"untar 20,000 small files: s" small5k:"untar 5,000 small files: s"; do
            key=${m%%:*}
            printf '| %s |' "${m#*:}"
            for k in $OVL_KINDS; do
                v=$(med "ov,$k,$key")
                if [ "$v" = fail ]; then printf ' fail |'; else printf ' %s |' "$(s_ "$v")"; fi
            done
            x=$(ratio "$(med "ov,sheaf,$key")" "$(med "ov,fovl-dir,$key")"); y=$(ratio "$(med "ov,sheaf,$key")" "$(med "ov,fovl-sheaf,$key")")
            echo " $x | $y | < $T_OVL | $(verdict "$x" lt $T_OVL) |"
        done
        for k in $OVL_KINDS; do
            for key in dd dd_fsync small20k small5k; do
                [ -n "${ERR[ov,$k,$key]:-}" ] && echo "- $k, $key failed: \`${ERR[ov,$k,$key]}\`${R[ov,$k,$key,made]:+ after ${R[ov,$k,$key,made]} files}${R[ov,$k,$key,fds]:+; server had ${R[ov,$k,$key,fds]}}"
            done
        done
        echo
        echo "\`sheaf stats\` of the sheaf overlay after each write test (last run):"
        for t in dd dd_fsync small20k small5k; do echo "- $t: $(stats_line "$LOGS/stats.ov.$t.json")"; done
        echo
        echo "dd throughput (MB/s, no fsync / fsync): $(for k in $OVL_KINDS; do printf '%s %s / %s; ' "$k" "$(f '%.0f' "b*1048576/(a/1e9)/1e6" "$(med "ov,$k,dd")" "$DD_MIB")" "$(f '%.0f' "b*1048576/(a/1e9)/1e6" "$(med "ov,$k,dd_fsync")" "$DD_MIB")"; done)"
        echo
        echo "### git on tree K in the overlay"
        echo
        echo "Once per overlay, on a fresh upper: \`git init && git add -A -f -- $GIT_ADD_PATHS && git commit\`"
        echo "($(cd "$DATA/K" && find $GIT_ADD_PATHS ! -type d | wc -l) files: all of K takes 2–3 minutes per kind here; -f: Debian's linux-source .gitignore ignores \`/*\`)."
        echo "For \`git status\`, every overlay gets the same repository of all of K (made once on the"
        echo "plain tree, objects packed) copied into its upper; the first status refreshes the index (inode numbers and"
        echo "ctimes differ, so every file is read and hashed through the overlay). Then \`$GIT_STATUS\`:"
        echo "--ignored makes git walk every directory as status does in a kernel checkout (plain \`git status\` here only"
        echo "lstat()s the tracked files: the top-level \`/*\` rule stops the walk). Cold = fresh mount(s) after drop_caches."
        echo
        printf '| measure |'; for k in $GIT_KINDS; do printf ' %s |' "$k"; done; echo ' sheaf / fovl-dir | sheaf / fovl-sheaf | target | verdict |'
        printf '|---|'; for k in $GIT_KINDS; do printf -- '---:|'; done; echo '---:|---:|---|---|'
        for m in add:"git init + add -A + commit (once)" refresh:"first status: index refresh, all files hashed (once)" status_cold:"git status, cold" status_warm:"git status, warm"; do
            key=${m%%:*}
            printf '| %s |' "${m#*:}"
            for k in $GIT_KINDS; do v=$(med "git,$k,$key"); [ "$v" = fail ] && printf ' **fail** |' || printf ' %s |' "$(s_ "$v")"; done
            if [ "$key" = refresh ]; then echo " n/c | n/c | — | — |"; continue; fi
            x=$(ratio "$(med "git,sheaf,$key")" "$(med "git,fovl-dir,$key")"); y=$(ratio "$(med "git,sheaf,$key")" "$(med "git,fovl-sheaf,$key")")
            echo " $x | $y | < $T_OVL | $(verdict "$x" lt $T_OVL) |"
        done
        echo
        echo "- n/c: not comparable: fuse-overlayfs over the extracted tree shows K's own inode numbers and ctimes, which the"
        echo "  copied index already holds, so its first status hashes nothing; through sheaf every file is read and hashed."
        for k in $GIT_KINDS; do
            echo "- $k: ${R[git,$k,tracked]:-?} files tracked; .git after add + commit $(mb "${R[git,$k,gitdir]:-}") MB$( [ -z "${ERR[git,$k,add]:-}" ] || printf '; **add + commit failed**: `%s`%s%s' "${ERR[git,$k,add]}" "${R[git,$k,objs]:+ after ${R[git,$k,objs]} files written under .git/objects}" "${R[git,$k,fds]:+, the server holding ${R[git,$k,fds]}}")"
        done
        echo
        echo "\`sheaf stats\` of the sheaf overlay after the last cold + warm status: $(stats_line "$LOGS/stats.git.json")"
    fi
    echo
    echo "## Every run (s, in run order)"
    echo
    echo "| measure | runs |"
    echo "|---|---|"
    for key in $(printf '%s\n' "${!R[@]}" | LC_ALL=C sort); do
        v=${R[$key]}
        [[ $v == " "* ]] || continue          # only the per-run series (added with add)
        printf '| %s |' "$key"
        for x in $v; do printf ' %s' "$(f '%.3f' 'a/1e9' "$x")"; done
        echo " |"
    done
} > "$OUT"
cat "$OUT"
log "wrote $OUT"
