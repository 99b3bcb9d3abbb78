#!/usr/bin/env bash
# Prepare the benchmark machine: install the anchor tools and build the test trees.
# Idempotent; run as root on Debian 12. Data goes to ${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}:
#   K  Linux 6.1 source (Debian's linux-source-6.1)
#   P  pip install --target of a scientific Python stack
#   M  1,000,000 small files (1000 dirs x 1000 files, 0-200 bytes, deterministic)
#   V  many versions of one stack: the manylinux x86_64 CPython 3.11 wheels of 15
#      numpy/scipy/pandas/matplotlib releases from PyPI, each unpacked into
#      V/install/NAME/VERSION (issue 42; not in the default set)
# Each tree is built in NAME.tmp and renamed when complete; a marker .NAME.done sits
# beside it (outside the tree, so it is not packed).
# Usage: bench/setup.sh [K] [P] [M] [V]   (default: K P M; `make test` asks for K and P)
set -euo pipefail
TREES=("$@"); [ ${#TREES[@]} -gt 0 ] || TREES=(K P M)
want() { [[ " ${TREES[*]} " == *" $1 "* ]]; }

DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
PKGS=(squashfs-tools erofs-utils linux-source-6.1 time python3-venv python3-pip)
PY_PKGS=(numpy scipy pandas matplotlib scikit-learn sympy h5py numba llvmlite pillow networkx)
PYTHON=${PYTHON:-python3}

log() { printf '[setup %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (apt-get install, drop_caches)"

# --- packages -------------------------------------------------------------------------
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q "${missing[@]}"
else
    log "packages already installed"
fi
command -v mksquashfs >/dev/null || die "mksquashfs not found after install"
command -v mkfs.erofs >/dev/null || die "mkfs.erofs not found after install"
[ -x /usr/bin/time ] || die "/usr/bin/time not found after install"

mkdir -p "$DATA"

# --- tree K ---------------------------------------------------------------------------
if ! want K; then
    :
elif [ -f "$DATA/.K.done" ] && [ -d "$DATA/K" ]; then
    log "K: present ($DATA/K)"
else
    src=$(ls /usr/src/linux-source-6.1.tar.xz 2>/dev/null || true)
    [ -n "$src" ] || die "K: /usr/src/linux-source-6.1.tar.xz missing"
    log "K: extracting $src"
    rm -rf "$DATA/K" "$DATA/K.tmp"
    mkdir "$DATA/K.tmp"
    tar -xJf "$src" -C "$DATA/K.tmp" --strip-components=1
    mv "$DATA/K.tmp" "$DATA/K"
    touch "$DATA/.K.done"
    log "K: done ($(find "$DATA/K" | wc -l) entries, $(du -sh --apparent-size "$DATA/K" | cut -f1))"
fi

# --- tree P ---------------------------------------------------------------------------
if ! want P; then
    :
elif [ -f "$DATA/.P.done" ] && [ -d "$DATA/P" ]; then
    log "P: present ($DATA/P)"
else
    log "P: pip install --target ($("$PYTHON" --version 2>&1)): ${PY_PKGS[*]}"
    rm -rf "$DATA/P" "$DATA/P.tmp"
    "$PYTHON" -m pip install --quiet --no-cache-dir --disable-pip-version-check \
        --target "$DATA/P.tmp" "${PY_PKGS[@]}"
    mv "$DATA/P.tmp" "$DATA/P"
    touch "$DATA/.P.done"
    log "P: done ($(find "$DATA/P" | wc -l) entries, $(du -sh --apparent-size "$DATA/P" | cut -f1))"
fi

# --- tree M ---------------------------------------------------------------------------
if ! want M; then
    :
elif [ -f "$DATA/.M.done" ] && [ -d "$DATA/M" ]; then
    log "M: present ($DATA/M)"
else
    log "M: generating 1000 x 1000 small files"
    rm -rf "$DATA/M" "$DATA/M.tmp"
    "$PYTHON" - "$DATA/M.tmp" <<'EOF'
import hashlib, os, sys
root = sys.argv[1]
os.mkdir(root)
# Deterministic pool of content; each file takes a slice of 0..200 bytes.
pool = b"".join(hashlib.sha256(str(i).encode()).hexdigest().encode() for i in range(4096))
flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
for d in range(1000):
    dp = os.path.join(root, "d%03d" % d)
    os.mkdir(dp)
    for f in range(1000):
        n = d * 1000 + f
        size = (n * 2654435761) % 201          # 0..200, spread deterministically
        off = (n * 40503) % (len(pool) - 201)
        fd = os.open(os.path.join(dp, "f%03d" % f), flags, 0o644)
        if size:
            os.write(fd, pool[off:off + size])
        os.close(fd)
EOF
    mv "$DATA/M.tmp" "$DATA/M"
    touch "$DATA/.M.done"
    log "M: done ($(find "$DATA/M" -type f | wc -l) files)"
fi

# --- tree V ---------------------------------------------------------------------------
V_WHEELS=(numpy==1.24.4 numpy==1.26.4 numpy==2.0.2 numpy==2.1.3 numpy==2.2.6
          scipy==1.11.4 scipy==1.13.1 scipy==1.14.1 scipy==1.15.3
          pandas==2.0.3 pandas==2.1.4 pandas==2.2.3
          matplotlib==3.7.5 matplotlib==3.8.4 matplotlib==3.9.4)
if ! want V; then
    :
elif [ -f "$DATA/.V.done" ] && [ -d "$DATA/V" ]; then
    log "V: present ($DATA/V)"
else
    log "V: downloading ${#V_WHEELS[@]} wheels (cp311, manylinux2014_x86_64)"
    rm -rf "$DATA/V" "$DATA/V.tmp" "$DATA/V.wheels"
    mkdir -p "$DATA/V.wheels" "$DATA/V.tmp/install"
    # Fixed versions, binary wheels only, no dependencies: the same bytes on
    # every machine (PyPI files never change once uploaded). One at a time:
    # pip refuses two versions of one name in one resolution.
    for spec in "${V_WHEELS[@]}"; do
        "$PYTHON" -m pip download --quiet --no-cache-dir --disable-pip-version-check \
            --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
            --abi cp311 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
            --dest "$DATA/V.wheels" "$spec"
    done
    for spec in "${V_WHEELS[@]}"; do
        name=${spec%%==*} ver=${spec##*==}
        whl=$(ls "$DATA/V.wheels/$name-$ver-"*.whl 2>/dev/null | head -n 1)
        [ -n "$whl" ] || die "V: no wheel for $spec"
        "$PYTHON" -m zipfile -e "$whl" "$DATA/V.tmp/install/$name/$ver"
    done
    # zipfile keeps no modes or times: make them uniform, so the tree is the
    # same wherever it is made.
    find "$DATA/V.tmp" -type d -exec chmod 755 {} +
    find "$DATA/V.tmp" -type f -exec chmod 644 {} +
    find "$DATA/V.tmp" -exec touch -h -d @1700000000 {} +
    mv "$DATA/V.tmp" "$DATA/V"
    rm -rf "$DATA/V.wheels"
    touch "$DATA/.V.done"
    log "V: done ($(find "$DATA/V" | wc -l) entries, $(du -sh --apparent-size "$DATA/V" | cut -f1))"
fi

log "trees ${TREES[*]} ready under $DATA"
