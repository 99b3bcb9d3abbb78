#!/usr/bin/env bash
# sheaf benchmark: builds trees K and P with sheaf and the anchors (mksquashfs, mkfs.erofs),
# measures sheaf check / info on the default image, and sheaf's memory per file on tree M.
# Prepare the machine first with bench/setup.sh (root). Writes bench/results/YYYY-MM-DD-HHMM.md.
#
# Environment:
#   SHEAF             sheaf binary            (default: $(dirname $0)/../target/release/sheaf)
#   SHEAF_MAX_OPTS    options of "sheaf max"  (default: -c xz:9 --block-size 4M)
#   SHEAF_BENCH_DATA  data dir from setup.sh  (default: /var/tmp/sheaf-bench)
#   BENCH_TREES       trees to run            (default: "K P M")
#   BENCH_BUILDERS    builders to run on K/P  (default: all of
#                     "sheaf-default sheaf-max sqfs-zstd sqfs-gzip sqfs-xz sqfs-lz4 erofs-lz4hc")
#   BENCH_INFO_RUNS   runs for the info median (default: 20)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SHEAF=${SHEAF:-$HERE/../target/release/sheaf}
SHEAF_MAX_OPTS=${SHEAF_MAX_OPTS:--c xz:9 --block-size 4M}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
BENCH_TREES=${BENCH_TREES:-K P M}
BENCH_BUILDERS=${BENCH_BUILDERS:-sheaf-default sheaf-max sqfs-zstd sqfs-gzip sqfs-xz sqfs-lz4 erofs-lz4hc}
INFO_RUNS=${BENCH_INFO_RUNS:-20}
NPROC=$(nproc)
STAMP=$(date +%Y-%m-%d-%H%M)
RESULTS_DIR=$HERE/results
OUT=$RESULTS_DIR/$STAMP.md
n=2; while [ -e "$OUT" ]; do OUT=$RESULTS_DIR/$STAMP-$n.md; n=$((n + 1)); done
TIME=/usr/bin/time

# Targets
T_SIZE=0.9        # sheaf-default size / squashfs-zstd size  <=
T_WALL=0.5        # sheaf-default wall / squashfs-zstd wall  <=
T_MAXSIZE=1.0     # sheaf-max size / squashfs-xz size        <=
T_CHECK=500       # sheaf check MB/s per core               >=
T_INFO=20         # sheaf info median ms                     <=

log() { printf '[bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ------------------------------------------------------------------------------------------
# preflight
[ -x "$TIME" ] || die "$TIME missing: run bench/setup.sh"
command -v python3 >/dev/null || die "python3 missing: run bench/setup.sh"
[ -d "$DATA" ] || die "data dir $DATA missing: run bench/setup.sh"
SHEAF_OK=1
if [ ! -x "$SHEAF" ]; then
    log "WARNING: sheaf binary $SHEAF not found; sheaf rows will read 'fail' (build it with cargo build --release)"
    SHEAF_OK=0
else
    SHEAF=$(cd "$(dirname "$SHEAF")" && pwd)/$(basename "$SHEAF")
fi
CACHE_NOTE="page cache dropped before each build"
if ! { [ -w /proc/sys/vm/drop_caches ] && sync && echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null; then
    log "WARNING: cannot drop the page cache (not root?); builds will run with a warm cache"
    CACHE_NOTE="page cache NOT dropped (no permission): builds ran warm"
fi

SCRATCH=$(mktemp -d "$DATA/scratch.XXXXXX")
cleanup() { rm -rf "$SCRATCH"; }
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

drop_caches() { sync; echo 3 2>/dev/null > /proc/sys/vm/drop_caches || true; }

# R[key] holds every measured value; a missing key prints as "fail" / "n/a".
declare -A R
get() { printf '%s' "${R[$1]:-fail}"; }

# Arithmetic helpers on strings that may be "fail": print "fail" if any operand is not a number.
calc() { # calc EXPR-with-$1.. args...   e.g. calc '%.3f' 'a/b' 1 2
    local fmt=$1 expr=$2; shift 2
    awk -v fmt="$fmt" -v expr="$expr" 'BEGIN {
        for (i = 1; i < ARGC; i++) { if (ARGV[i] !~ /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/) { print "fail"; exit } ; v[i] = ARGV[i] + 0 }
        a = v[1]; b = v[2]; c = v[3]
        if (expr == "a/b")        { if (b == 0) { print "fail"; exit } ; r = a / b }
        else if (expr == "a/1e6") r = a / 1e6
        else if (expr == "a/1024") r = a / 1024
        else if (expr == "a/b/1e6/c") { if (b == 0 || c == 0) { print "fail"; exit } ; r = a / b / 1e6 / c }
        else if (expr == "a/b/1e6") { if (b == 0) { print "fail"; exit } ; r = a / b / 1e6 }
        else if (expr == "(a-b)*1024/1e6") r = (a - b) * 1024 / 1e6
        else { print "fail"; exit }
        printf fmt "\n", r }' "$@"
}
verdict() { # verdict VALUE OP TARGET  (OP is le or ge)
    awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN {
        if (v !~ /^-?[0-9]+(\.[0-9]+)?$/) { print "n/a"; exit }
        ok = (op == "le") ? (v + 0 <= t + 0) : (v + 0 >= t + 0)
        print ok ? "PASS" : "FAIL" }'
}

# measure KEY IMAGE CMD...: drop caches, run CMD under /usr/bin/time, record wall/rss/size.
measure() {
    local key=$1 img=$2; shift 2
    local tf=$SCRATCH/time.$$ lf=$SCRATCH/log.${key//\//_}
    rm -f "$img"
    drop_caches
    log "$key: $*"
    if "$TIME" -f '%e %M' -o "$tf" -- "$@" >"$lf" 2>&1 </dev/null && [ -e "$img" ]; then
        read -r wall rss < <(tail -n 1 "$tf")
        R[$key/wall]=$wall
        R[$key/rss]=$rss
        R[$key/size]=$(stat -c %s "$img")
        log "$key: ${wall} s, peak RSS $((rss / 1024)) MiB, image $(calc '%.1f' a/1e6 "${R[$key/size]}") MB"
        return 0
    else
        log "$key: FAILED (exit status or no image); last lines of output:"
        tail -n 5 "$lf" | sed 's/^/    /' >&2
        tail -n 2 "$tf" 2>/dev/null | sed 's/^/    /' >&2 || true
        return 1
    fi
}

want_builder() { case " $BENCH_BUILDERS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

build_tree() { # build_tree TREE (K or P)
    local t=$1 src=$DATA/$1 img
    # shellcheck disable=SC2206
    local max_opts=($SHEAF_MAX_OPTS)
    R[$t/entries]=$(find "$src" | wc -l)
    R[$t/bytes]=$(du -s --apparent-size -B1 "$src" | cut -f1)
    for b in $BENCH_BUILDERS; do
        img=$SCRATCH/$t.$b.img
        case $b in
            sheaf-default) [ $SHEAF_OK = 1 ] && measure "$t/$b" "$img" "$SHEAF" build "$src" -o "$img" --force || true ;;
            sheaf-max)     [ $SHEAF_OK = 1 ] && measure "$t/$b" "$img" "$SHEAF" build "$src" -o "$img" --force "${max_opts[@]}" || true ;;
            sqfs-*)        measure "$t/$b" "$img" mksquashfs "$src" "$img" -noappend -comp "${b#sqfs-}" -quiet -no-progress || true ;;
            erofs-lz4hc)   measure "$t/$b" "$img" mkfs.erofs -zlz4hc "$img" "$src" || true ;;
            *) log "unknown builder $b (ignored)" ;;
        esac
        # keep only the sheaf default image (for check/info); free the disk space of the rest
        [ "$b" = sheaf-default ] || rm -f "$img"
    done
    [ $SHEAF_OK = 1 ] && want_builder sheaf-default && [ -e "$SCRATCH/$t.sheaf-default.img" ] && check_info "$t"
    rm -f "$SCRATCH/$t.sheaf-default.img"
}

check_info() { # check / info on the sheaf default image of TREE
    local t=$1 img=$SCRATCH/$1.sheaf-default.img tf=$SCRATCH/time.$$ json
    if json=$("$SHEAF" info "$img" --json 2>"$SCRATCH/log.info"); then
        R[$t/logical]=$(printf '%s' "$json" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["logical_bytes"]))' 2>/dev/null || echo fail)
        R[$t/image_bytes]=$(printf '%s' "$json" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["image_bytes"]))' 2>/dev/null || echo fail)
    else
        log "$t: sheaf info --json FAILED: $(tail -n 3 "$SCRATCH/log.info")"
    fi
    # check runs with the image warm in the page cache (it was just written): CPU-bound figure.
    log "$t/check: $SHEAF check (warm cache, $NPROC cores)"
    if "$TIME" -f '%e %M' -o "$tf" -- "$SHEAF" check "$img" >"$SCRATCH/log.check" 2>&1 </dev/null; then
        read -r wall rss < <(tail -n 1 "$tf")
        R[$t/check_wall]=$wall
        R[$t/check_rss]=$rss
        R[$t/check_mbs]=$(calc '%.0f' a/b/1e6 "$(get "$t/logical")" "$wall")
        R[$t/check_mbs_core]=$(calc '%.0f' a/b/1e6/c "$(get "$t/logical")" "$wall" "$NPROC")
        log "$t/check: ${wall} s, $(get "$t/check_mbs") MB/s, $(get "$t/check_mbs_core") MB/s/core"
    else
        log "$t/check: FAILED: $(tail -n 3 "$SCRATCH/log.check")"
    fi
    R[$t/info_ms]=$(info_latency "$img") || R[$t/info_ms]=fail
    log "$t/info: median $(get "$t/info_ms") ms over $INFO_RUNS runs"
}

info_latency() { # median wall ms of "sheaf info IMAGE" over INFO_RUNS runs (after 2 warm-ups)
    local img=$1 hj=$SCRATCH/hyperfine.json
    if command -v hyperfine >/dev/null; then
        hyperfine -N --style none --warmup 2 --runs "$INFO_RUNS" --export-json "$hj" \
            "$SHEAF info $img" >/dev/null 2>&1 || return 1
        python3 -c 'import json,sys; print("%.2f" % (json.load(open(sys.argv[1]))["results"][0]["median"] * 1000))' "$hj"
    else
        python3 - "$INFO_RUNS" "$SHEAF" info "$img" <<'EOF'
import statistics, subprocess, sys, time
n, cmd = int(sys.argv[1]), sys.argv[2:]
run = lambda: subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
run(); run()
ts = []
for _ in range(n):
    t0 = time.perf_counter(); run(); ts.append(time.perf_counter() - t0)
print("%.2f" % (statistics.median(ts) * 1000))
EOF
    fi
}

tree_m() {
    # Bytes per file = the slope between tree M and a 10% copy of it, so the
    # fixed cost of the compression pipeline (contexts, blocks in flight)
    # cancels out; a 1-file build would not allocate it and would inflate it.
    local m10=$SCRATCH/m10
    mkdir -p "$m10"
    for d in $(ls "$DATA/M" | head -100); do cp -r "$DATA/M/$d" "$m10/"; done
    local n_m n_10
    n_m=$(find "$DATA/M" | wc -l); n_10=$(find "$m10" | wc -l)
    R[M/entries]=$n_m; R[M10/entries]=$n_10
    if [ $SHEAF_OK = 1 ]; then
        measure "M10/sheaf-default" "$SCRATCH/m10.img" "$SHEAF" build "$m10" -o "$SCRATCH/m10.img" --force || true
        measure "M/sheaf-default" "$SCRATCH/M.img" "$SHEAF" build "$DATA/M" -o "$SCRATCH/M.img" --force || true
    fi
    rm -rf "$SCRATCH/m10.img" "$SCRATCH/M.img" "$m10"
    R[M/bytes_per_file]=$(awk -v a="$(get M/sheaf-default/rss)" -v b="$(get M10/sheaf-default/rss)" -v n="$n_m" -v m="$n_10" \
        'BEGIN { if (a ~ /^[0-9]+$/ && b ~ /^[0-9]+$/ && n > m) printf "%.0f", (a - b) * 1024 / (n - m); else print "fail" }')
    log "M: $(get M/bytes_per_file) bytes of peak RSS per file"
}

# ------------------------------------------------------------------------------------------
log "sheaf=$SHEAF data=$DATA trees='$BENCH_TREES' scratch=$SCRATCH"
T0=$(date +%s)
for t in $BENCH_TREES; do
    case $t in
        K|P)
            if [ -f "$DATA/.$t.done" ] && [ -d "$DATA/$t" ]; then build_tree "$t"
            else log "tree $t missing under $DATA: run bench/setup.sh (skipped)"; R[$t/missing]=1; fi ;;
        M)
            if [ -f "$DATA/.M.done" ] && [ -d "$DATA/M" ]; then tree_m
            else log "tree M missing under $DATA: run bench/setup.sh (skipped)"; R[M/missing]=1; fi ;;
        *) log "unknown tree '$t' (ignored)" ;;
    esac
done
T1=$(date +%s)

# ------------------------------------------------------------------------------------------
# report
ver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo '?'; }
sheaf_rev=$(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null || echo '?')
git -C "$HERE/.." diff --quiet HEAD 2>/dev/null || sheaf_rev="$sheaf_rev+dirty"
mb()  { calc '%.1f' a/1e6 "$1"; }
mib() { calc '%.0f' a/1024 "$1"; }

report() {
    echo "# sheaf benchmark $STAMP"
    echo
    echo "- host: $(hostname), $NPROC cores, $(free -g | awk '/^Mem:/ {print $2}') GiB, kernel $(uname -r)"
    echo "- sheaf: $SHEAF (git $sheaf_rev$([ $SHEAF_OK = 1 ] && "$SHEAF" --version 2>/dev/null | head -n 1 | sed 's/^/, /'))$([ $SHEAF_OK = 1 ] || echo ' — NOT FOUND')"
    echo "- sheaf max options: \`$SHEAF_MAX_OPTS\`"
    echo "- squashfs-tools $(ver squashfs-tools), erofs-utils $(ver erofs-utils); $CACHE_NOTE; single runs"
    echo "- trees: $BENCH_TREES; total time $((T1 - T0)) s"
    for t in K P; do
        case " $BENCH_TREES " in *" $t "*) ;; *) continue ;; esac
        [ -z "${R[$t/missing]:-}" ] || { echo; echo "Tree $t: missing (run bench/setup.sh)"; continue; }
        echo
        echo "## Tree $t ($(get "$t/entries") entries, $(mb "$(get "$t/bytes")") MB apparent)"
        echo
        echo "| builder | wall s | peak RSS MiB | image MB |"
        echo "|---|---:|---:|---:|"
        for b in $BENCH_BUILDERS; do
            echo "| $b | $(get "$t/$b/wall") | $(mib "$(get "$t/$b/rss")") | $(mb "$(get "$t/$b/size")") |"
        done
        if want_builder sheaf-default; then
            echo
            echo "sheaf default image: logical $(mb "$(get "$t/logical")") MB, image $(mb "$(get "$t/image_bytes")") MB (info --json);" \
                 "check $(get "$t/check_wall") s (warm cache) = $(get "$t/check_mbs") MB/s = $(get "$t/check_mbs_core") MB/s/core" \
                 "($NPROC cores), peak RSS $(mib "$(get "$t/check_rss")") MiB; info median $(get "$t/info_ms") ms ($INFO_RUNS runs)."
        fi
    done
    case " $BENCH_TREES " in *" M "*)
        echo
        echo "## Tree M (1,000,000 small files)"
        echo
        if [ -n "${R[M/missing]:-}" ]; then echo "missing (run bench/setup.sh)"; else
        echo "| build | wall s | peak RSS MiB | image MB |"
        echo "|---|---:|---:|---:|"
        echo "| sheaf default, 10% of M ($(get M10/entries) entries) | $(get M10/sheaf-default/wall) | $(mib "$(get M10/sheaf-default/rss)") | $(mb "$(get M10/sheaf-default/size)") |"
        echo "| sheaf default, tree M ($(get M/entries) entries) | $(get M/sheaf-default/wall) | $(mib "$(get M/sheaf-default/rss)") | $(mb "$(get M/sheaf-default/size)") |"
        echo
        echo "Peak RSS per file: **$(get M/bytes_per_file) bytes** ((RSS_M − RSS_M10) / (entries_M − entries_M10))."
        fi ;;
    esac
    echo
    echo "## Targets"
    echo
    echo "| tree | metric | value | target | result |"
    echo "|---|---|---:|---:|---|"
    local v
    for t in K P; do
        case " $BENCH_TREES " in *" $t "*) ;; *) continue ;; esac
        [ -z "${R[$t/missing]:-}" ] || continue
        v=$(calc '%.3f' a/b "$(get "$t/sheaf-default/size")" "$(get "$t/sqfs-zstd/size")")
        echo "| $t | size sheaf-default / squashfs-zstd | $v | ≤ $T_SIZE | $(verdict "$v" le $T_SIZE) |"
        v=$(calc '%.3f' a/b "$(get "$t/sheaf-default/wall")" "$(get "$t/sqfs-zstd/wall")")
        echo "| $t | wall sheaf-default / squashfs-zstd | $v | ≤ $T_WALL | $(verdict "$v" le $T_WALL) |"
        v=$(calc '%.3f' a/b "$(get "$t/sheaf-max/size")" "$(get "$t/sqfs-xz/size")")
        echo "| $t | size sheaf-max / squashfs-xz | $v | ≤ $T_MAXSIZE | $(verdict "$v" le $T_MAXSIZE) |"
        v=$(get "$t/check_mbs_core")
        echo "| $t | sheaf check MB/s per core | $v | ≥ $T_CHECK | $(verdict "$v" ge $T_CHECK) |"
        v=$(get "$t/info_ms")
        echo "| $t | sheaf info median ms | $v | ≤ $T_INFO | $(verdict "$v" le $T_INFO) |"
    done
    case " $BENCH_TREES " in *" M "*)
        [ -n "${R[M/missing]:-}" ] || echo "| M | peak RSS bytes per file | $(get M/bytes_per_file) | — | — |" ;;
    esac
}

mkdir -p "$RESULTS_DIR"
report > "$OUT"
echo
cat "$OUT"
echo
log "results written to $OUT"
