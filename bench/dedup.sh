#!/usr/bin/env bash
# Many versions, one image (issue 42): what sheaf finds across the versions
# of a software pool, against mksquashfs, DwarFS and a solid zstd stream.
#   sizes and build times of trees V, K and P: mksquashfs -comp zstd; sheaf
#   default; sheaf with each lever alone (--order directory --no-group-blocks
#   is the packing before issue 42; --no-group-blocks is the versions order
#   alone; --ref-window 0 turns reference blocks off, and --order directory
#   --no-group-blocks leaves them alone; the default has all three); sheaf
#   archive options (ARCHIVE, default --archive: 64 MiB blocks and packs,
#   xz:9); `tar | zstd -19 --long=31` (SOLID_TREES); mkdwarfs default and
#   -l9 when a mkdwarfs is at hand (MKDWARFS, or DWARFS=1 builds one);
#   5000 random files (seeded choice) of V and of K read by
#   `xargs -P 4 -n 50 cat` on a fresh mount after drop_caches: kernel
#   squashfs, sheaf default, sheaf before issue 42 (and dwarfs' FUSE driver);
#   adding a 16th version to V with --base: V without numpy 2.2.6 is built,
#   then V with --base; the new stored bytes against
#   `zstd -19 --long=31 --patch-from` of 2.2.6's tar over 2.1.3's.
# Page cache dropped before each build; one build each. Writes
# bench/results/DATE-dedup.md.
#
# Usage: bench/dedup.sh   (root; after bench/setup.sh K P V)
# Env:   SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench), TREES (default
#        "V K P"), ARCHIVE_TREES (default "V K": the xz:9 builds are slow),
#        SOLID_TREES (default V; both may be empty), ARCHIVE (the archive
#        options), MKDWARFS (a mkdwarfs binary),
#        DWARFS=1 (build DwarFS v0.15.3 from source into $DATA/dwarfs, used by
#        later runs without asking: a long
#        C++ build, see build_dwarfs; GIT_MIRROR=DIR takes its sources from
#        DIR/OWNER+NAME/repo in place of GitHub), READS (default 1: the random reads)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
TREES=${TREES:-"V K P"}
SOLID_TREES=${SOLID_TREES-V}
ARCHIVE_TREES=${ARCHIVE_TREES-"V K"}
DWARFS=${DWARFS:-0}
MKDWARFS=${MKDWARFS:-}
READS=${READS:-1}
ARCHIVE=${ARCHIVE:-"--archive"}
OUT=$ROOT/bench/results/$(date -u +%Y-%m-%d-%H%M)-dedup.md

log() { printf '[dedup %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (loop mounts, drop_caches)"
[ -x "$SHEAF" ] || die "$SHEAF missing: run make build"
for t in $TREES; do [ -d "$DATA/$t" ] || die "$DATA/$t missing: run bench/setup.sh $t"; done
command -v mksquashfs >/dev/null || die "mksquashfs missing (apt-get install squashfs-tools)"
command -v zstd >/dev/null || die "zstd missing (apt-get install zstd)"

# --- DwarFS from source (DWARFS=1) ----------------------------------------------------------
# v0.15.3 builds on Debian 12 with gcc 12 from these -dev packages, cmake >= 3.28 and
# mistletoe from PyPI, and fmt >= 10 and parallel-hashmap from their repositories, handed
# to the build through DWARFS_LOCAL_REPO_PATH (it fetches nothing itself then).
build_dwarfs() {
    local d=$DATA/dwarfs
    [ -x "$d/install/bin/mkdwarfs" ] && { MKDWARFS=$d/install/bin/mkdwarfs; return; }
    log "building DwarFS v0.15.3 in $d (long)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q git g++ ninja-build pkg-config bison flex ronn \
        libboost-chrono-dev libboost-context-dev libboost-filesystem-dev libboost-iostreams-dev \
        libboost-program-options-dev libboost-regex-dev libboost-system-dev libboost-thread-dev \
        libarchive-dev libxxhash-dev libzstd-dev liblz4-dev liblzma-dev libbrotli-dev \
        libflac++-dev libjemalloc-dev libmagic-dev librange-v3-dev libfuse3-dev libacl1-dev \
        nlohmann-json3-dev libutfcpp-dev libhowardhinnant-date-dev libssl-dev libdouble-conversion-dev \
        libgoogle-glog-dev libevent-dev libunwind-dev libdwarf-dev libelf-dev
    mkdir -p "$d/repos"
    python3 -m venv "$d/venv"
    "$d/venv/bin/pip" install --quiet 'cmake>=3.28' mistletoe
    # GIT_MIRROR=DIR clones OWNER/NAME from DIR/OWNER+NAME/repo in place of GitHub.
    local gh=https://github.com/ mirror=""
    [ -n "${GIT_MIRROR:-}" ] && mirror=$GIT_MIRROR
    src() { if [ -n "$mirror" ]; then echo "$mirror/${1/\//+}/repo"; else echo "$gh$1"; fi; }
    [ -d "$d/src" ] || git clone -q --depth 1 --branch v0.15.3 "$(src mhx/dwarfs)" "$d/src"
    [ -d "$d/repos/fmt" ] || git clone -q --depth 1 --branch 11.0.2 "$(src fmtlib/fmt)" "$d/repos/fmt"
    [ -d "$d/repos/parallel-hashmap" ] || git clone -q --depth 1 --branch v1.4.0 \
        "$(src greg7mdp/parallel-hashmap)" "$d/repos/parallel-hashmap"
    PATH=$d/venv/bin:$PATH DWARFS_LOCAL_REPO_PATH=$d/repos \
        cmake -S "$d/src" -B "$d/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DWITH_TESTS=OFF -DCMAKE_INSTALL_PREFIX="$d/install"
    PATH=$d/venv/bin:$PATH ninja -C "$d/build" install
    MKDWARFS=$d/install/bin/mkdwarfs
}
[ "$DWARFS" = 1 ] && build_dwarfs
# One built before (DWARFS=1 on an earlier run) is used without asking.
[ -z "$MKDWARFS" ] && [ -x "$DATA/dwarfs/install/bin/mkdwarfs" ] && MKDWARFS=$DATA/dwarfs/install/bin/mkdwarfs
DWARFS_FUSE=""
[ -n "$MKDWARFS" ] && DWARFS_FUSE=$(dirname "$MKDWARFS")/dwarfs
[ -n "$DWARFS_FUSE" ] && [ ! -x "$DWARFS_FUSE" ] && DWARFS_FUSE=""

WORK=$(mktemp -d "$DATA/dedup.XXXXXX")
MP=$(mktemp -d /tmp/sheaf-bench-dedup.XXXXXX)
CUR=""
umnt() {
    case $CUR in "") ;; sheaf*) "$SHEAF" umount "$MP" ;; *) umount "$MP" ;; esac
    CUR=""
}
cleanup() { umnt 2>/dev/null || true; rm -rf "$WORK"; rmdir "$MP" 2>/dev/null || true; }
trap cleanup EXIT

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now_ns() { date +%s%N; }
secs() { awk -v n="$1" 'BEGIN { printf "%.1f", n / 1e9 }'; }
mb() { awk -v n="$1" 'BEGIN { printf "%.1f", n / 1e6 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
verdict() { awk -v x="$1" -v t="$2" 'BEGIN { print (x <= t) ? "met" : "MISSED" }'; }
declare -A R

# Sheaf variants: key, label, flags.
VARIANTS=(
    "before|sheaf, packing before issue 42 (--order directory --no-group-blocks --ref-window 0)|--order directory --no-group-blocks --ref-window 0"
    "order|sheaf, versions order alone (--no-group-blocks --ref-window 0)|--no-group-blocks --ref-window 0"
    "group|sheaf, versions order + group blocks (--ref-window 0)|--ref-window 0"
    "refs|sheaf, reference blocks alone (--order directory --no-group-blocks)|--order directory --no-group-blocks"
    "default|sheaf default (versions order + group blocks + reference blocks)|"
    "archive|sheaf $ARCHIVE|$ARCHIVE"
)
timed() { # timed KEY CMD...: wall ns into R[KEY,build]
    local key=$1 s e; shift
    drop_caches
    s=$(now_ns); "$@" >/dev/null; e=$(now_ns)
    R[$key,build]=$((e - s))
}
for t in $TREES; do
    log "$t: mksquashfs -comp zstd"
    timed "sqfs,$t" mksquashfs "$DATA/$t" "$WORK/$t.sqfs" -noappend -comp zstd -quiet -no-progress
    R[sqfs,$t,size]=$(stat -c %s "$WORK/$t.sqfs")
    for v in "${VARIANTS[@]}"; do
        IFS='|' read -r key _ flags <<<"$v"
        [ "$key" = archive ] && [[ " $ARCHIVE_TREES " != *" $t "* ]] && continue
        log "$t: sheaf build $flags"
        # shellcheck disable=SC2086
        timed "$key,$t" "$SHEAF" build -q -f $flags "$DATA/$t" -o "$WORK/$t-$key.sheaf"
        R[$key,$t,size]=$(stat -c %s "$WORK/$t-$key.sheaf")
    done
    if [[ " $SOLID_TREES " == *" $t "* ]]; then
        log "$t: tar | zstd -19 --long=31"
        timed "solid,$t" sh -c "tar -C '$DATA/$t' -cf - . | zstd -q -19 --long=31 -T0 -o '$WORK/$t.tar.zst'"
        R[solid,$t,size]=$(stat -c %s "$WORK/$t.tar.zst")
    fi
    if [ -n "$MKDWARFS" ]; then
        for l in 7 9; do
            log "$t: mkdwarfs -l$l"
            timed "dwarfs$l,$t" "$MKDWARFS" -i "$DATA/$t" -o "$WORK/$t-l$l.dwarfs" -l "$l" --force --no-progress --log-level=error
            R[dwarfs$l,$t,size]=$(stat -c %s "$WORK/$t-l$l.dwarfs")
        done
    fi
done

# --- a 16th version with --base ----------------------------------------------------------------
if [[ " $TREES " == *" V "* ]]; then
    log "V: a 16th version (numpy 2.2.6) with --base"
    mkdir -p "$WORK/V16"
    cp -a "$DATA/V/." "$WORK/V16/"
    mv "$WORK/V16/install/numpy/2.2.6" "$WORK/new-2.2.6"
    "$SHEAF" build -q -f "$WORK/V16" -o "$WORK/V15.sheaf"
    mv "$WORK/new-2.2.6" "$WORK/V16/install/numpy/2.2.6"
    drop_caches
    s=$(now_ns)
    "$SHEAF" build -q -f --json --base "$WORK/V15.sheaf" "$WORK/V16" -o "$WORK/V16.sheaf" > "$WORK/base.json"
    e=$(now_ns); R[base,V,build]=$((e - s))
    # New stored bytes: the image's stored data less what was copied from the base.
    R[base,new]=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["stored_data_bytes"] - r["base"]["copied_stored_bytes"])' "$WORK/base.json")
    tar -C "$WORK/V16/install/numpy/2.1.3" -cf "$WORK/old.tar" .
    tar -C "$WORK/V16/install/numpy/2.2.6" -cf "$WORK/new.tar" .
    zstd -q -19 --long=31 --patch-from="$WORK/old.tar" "$WORK/new.tar" -o "$WORK/new.patch.zst"
    R[base,patch]=$(stat -c %s "$WORK/new.patch.zst")
    rm -rf "$WORK/V16" "$WORK/old.tar" "$WORK/new.tar"
fi

# --- cold random reads -------------------------------------------------------------------------
mnt() { # mnt KIND TREE
    case $1 in
        sqfs) mount -t squashfs -o loop,ro "$WORK/$2.sqfs" "$MP" ;;
        dwarfs) "$DWARFS_FUSE" "$WORK/$2-l7.dwarfs" "$MP" ;;
        sheaf-*) "$SHEAF" mount "$WORK/$2-${1#sheaf-}.sheaf" "$MP" ;;
    esac
    CUR=$1
}
READ_KINDS="sqfs sheaf-default sheaf-before"
[ -n "$DWARFS_FUSE" ] && READ_KINDS+=" dwarfs"
if [ "$READS" = 1 ]; then
    for t in $TREES; do
        [ "$t" = P ] && continue
        list=$WORK/$t.random
        (cd "$DATA/$t" && find . -type f -print) | sort | awk 'BEGIN { srand(42) } { print rand() "\t" $0 }' \
            | sort -k1,1 | awk 'NR <= 5000' | cut -f2- > "$list"
        for k in $READ_KINDS; do
            log "$t: 5000 random files, cold, $k"
            umnt; drop_caches; mnt "$k" "$t"
            s=$(now_ns); (cd "$MP" && xargs -a "$list" -d '\n' -P 4 -n 50 cat) >/dev/null; e=$(now_ns)
            R[$k,$t,random]=$((e - s))
            umnt
        done
    done
fi

# --- report ----------------------------------------------------------------------------------
row() { # row KEY LABEL TREE
    local k=$1 label=$2 t=$3
    [ -n "${R[$k,$t,size]:-}" ] || return 0
    echo "| $t | $label | $(mb "${R[$k,$t,size]}") | $(ratio "${R[$k,$t,size]}" "${R[sqfs,$t,size]}") | $(secs "${R[$k,$t,build]}") | $(ratio "${R[$k,$t,build]}" "${R[sqfs,$t,build]}") |"
}
{
    echo "# Many versions, one image (issue 42), $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "Machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r); load at end $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "sheaf $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- crates 2>/dev/null || echo ' (+ uncommitted changes)'); $(mksquashfs -version 2>&1 | head -1)$([ -n "$MKDWARFS" ] && echo "; $("$MKDWARFS" --help 2>&1 | grep -m1 '^mkdwarfs (')")."
    echo "Trees: V = 15 versions of numpy, scipy, pandas, matplotlib (bench/setup.sh V), K = Linux 6.1 source, P = a scientific Python stack. One build each, page cache dropped before."
    echo
    echo "| tree | tool | MB | × sqfs | build s | × mksquashfs |"
    echo "|---|---|---|---|---|---|"
    for t in $TREES; do
        row sqfs "mksquashfs -comp zstd" "$t"
        for v in "${VARIANTS[@]}"; do
            IFS='|' read -r key label _ <<<"$v"
            row "$key" "$label" "$t"
        done
        row solid '`tar | zstd -19 --long=31` (solid, no random access)' "$t"
        row dwarfs7 "mkdwarfs (default, -l7)" "$t"
        row dwarfs9 "mkdwarfs -l9" "$t"
    done
    if [ -z "$MKDWARFS" ]; then
        echo
        echo "No mkdwarfs in this run (DWARFS=1 builds one). The issue's figures for mkdwarfs 0.15.3, measured on this machine idle on 2026-11-27, are the anchor:"
        echo "V default 127.6 MB in 137 s, -l9 101.3 MB in 120 s; K default 153.3 MB in 220 s, -l9 142.7 MB in 241 s."
    fi
    if [ -n "${R[base,new]:-}" ]; then
        echo
        echo "A 16th version with --base (V without numpy 2.2.6, then V): new stored bytes $(mb "${R[base,new]}") MB in $(secs "${R[base,V,build]}") s; yardstick \`zstd -19 --long=31 --patch-from\` of 2.2.6's tar over 2.1.3's: $(mb "${R[base,patch]}") MB ($(ratio "${R[base,new]}" "${R[base,patch]}")×; target ≤ 1.2×: $(verdict "$(ratio "${R[base,new]}" "${R[base,patch]}")" 1.2))."
    fi
    if [ "$READS" = 1 ]; then
        echo
        echo "5000 random files (seeded), \`xargs -P 4 -n 50 cat\`, fresh mount after drop_caches, one run:"
        echo
        echo "| tree | reader | s | × kernel squashfs |"
        echo "|---|---|---|---|"
        for t in $TREES; do
            [ "$t" = P ] && continue
            for k in $READ_KINDS; do
                echo "| $t | $k | $(secs "${R[$k,$t,random]}") | $(ratio "${R[$k,$t,random]}" "${R[sqfs,$t,random]}") |"
            done
        done
    fi
    if [[ " $TREES " == *" V "* ]]; then
        echo
        echo "## Targets (issue 42)"
        echo
        echo "| target | measured | verdict |"
        echo "|---|---|---|"
        d=$(ratio "${R[default,V,size]}" "${R[sqfs,V,size]}")
        echo "| V default ≤ 0.5× mksquashfs | $d× | $(verdict "$d" 0.5) |"
        echo "| V default ≤ 120 MB (mkdwarfs default 127.6 MB) | $(mb "${R[default,V,size]}") MB | $(verdict "$(mb "${R[default,V,size]}")" 120) |"
        if [ -n "${R[archive,V,size]:-}" ]; then
            echo "| V archive ≤ 101.3 MB (mkdwarfs -l9) | $(mb "${R[archive,V,size]}") MB | $(verdict "$(mb "${R[archive,V,size]}")" 101.3) |"
        else
            echo "| V archive ≤ 101.3 MB (mkdwarfs -l9) | not built (ARCHIVE_TREES) | — |"
        fi
        b=$(ratio "${R[default,V,build]}" "${R[sqfs,V,build]}")
        echo "| V default build ≤ 1.0× mksquashfs | $b× | $(verdict "$b" 1.0) |"
        for t in K P; do
            [ -n "${R[default,$t,size]:-}" ] || continue
            echo "| $t default no worse than before | $(mb "${R[default,$t,size]}") MB vs $(mb "${R[before,$t,size]}") MB | $(verdict "${R[default,$t,size]}" "${R[before,$t,size]}") |"
        done
        if [ -n "${R[archive,K,size]:-}" ]; then
            echo "| K archive ≤ 142.7 MB (mkdwarfs -l9) | $(mb "${R[archive,K,size]}") MB | $(verdict "$(mb "${R[archive,K,size]}")" 142.7) |"
        fi
        if [ "$READS" = 1 ]; then
            for t in V K; do
                [ -n "${R[sheaf-default,$t,random]:-}" ] || continue
                r=$(ratio "${R[sheaf-default,$t,random]}" "${R[sqfs,$t,random]}")
                echo "| $t 5000 random files cold ≤ 0.5× kernel | $r× | $(verdict "$r" 0.5) |"
            done
            if [ -n "${R[dwarfs,V,random]:-}" ] && [ -n "${R[sheaf-default,V,random]:-}" ]; then
                r=$(ratio "${R[sheaf-default,V,random]}" "${R[dwarfs,V,random]}")
                echo "| V 5000 random files cold ≤ 0.5× the dwarfs FUSE driver | $r× | $(verdict "$r" 0.5) |"
            fi
        fi
    fi
} > "$OUT"
cat "$OUT"
log "wrote $OUT"
