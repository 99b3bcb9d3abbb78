#!/usr/bin/env bash
# Images over SSH against sshfs (issue 16 B): the same files read through a real sshd on
# 127.0.0.1 (own keys and config, started here), cold each time (fresh mount, page cache
# dropped, no node cache), medians of RUNS:
#   1. a ~5% hyperslab of a 256 MiB HDF5 file (h5py): sheaf mount of ssh://…/H5.sheaf
#      (default options, and -o readahead=0) vs sshfs of the unpacked directory;
#   2. cold `import numpy, scipy.linalg, pandas` from tree P: ssh://…/P.sheaf vs sshfs of P.
# Bytes moved = what the server's sftp-server read from its files (/proc/PID/io rchar),
# the same measure for both; sheaf's own count (ssh_bytes) beside it. Loopback is not
# shaped (no netem on this kernel), so times are the best case for the chattier sshfs.
# Writes bench/results/DATE-ssh.md.
#
# Usage: bench/ssh.sh        (root; after bench/setup.sh P)
# Env:   SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench), PYTHON (default python3: the
#        one tree P was installed for), RUNS (default 3)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
PYTHON=${PYTHON:-python3}
RUNS=${RUNS:-3}
IMPORT="import numpy, scipy.linalg, pandas"
H5_ROWS=4096 H5_COLS=8192 H5_SLAB=205     # float64: 256 MiB, 5% slab
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-ssh.md
log() { printf '[ssh-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (drop_caches)"
[ -x "$SHEAF" ] || die "$SHEAF missing: run make build"
[ -d "$DATA/P" ] || die "$DATA/P missing: run bench/setup.sh P"
command -v sshfs >/dev/null || die "sshfs missing (scripts/deps.sh)"
PYTHONPATH="$DATA/P" "$PYTHON" -c "import numpy, h5py" 2>/dev/null || die "$PYTHON cannot import numpy/h5py from $DATA/P"

WORK=$(mktemp -d "$DATA/ssh.XXXXXX")
MP=$WORK/mnt; mkdir -p "$MP"
cleanup() {
  fusermount3 -u "$MP" 2>/dev/null || umount -l "$MP" 2>/dev/null || true
  [ -f "$WORK/sshd.pid" ] && kill "$(cat "$WORK/sshd.pid")" 2>/dev/null || true
  pkill -f "sshd: .*@notty" -P "$(cat "$WORK/sshd.pid" 2>/dev/null || echo 1)" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now() { date +%s%N; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
secs() { awk -v n="$1" 'BEGIN { printf "%.2f", n / 1e9 }'; }
mb() { awk -v n="$1" 'BEGIN { printf "%.1f", n / 1e6 }'; }
py_in() { (cd /tmp && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$1" timeout 900 "$PYTHON" -c "$2"); }

# --- sshd on loopback -----------------------------------------------------------------------
PORT=$((20000 + RANDOM % 20000))
ssh-keygen -q -t ed25519 -N "" -f "$WORK/host_key"
ssh-keygen -q -t ed25519 -N "" -f "$WORK/client_key"
cp "$WORK/client_key.pub" "$WORK/authorized_keys"
mkdir -p /run/sshd
cat > "$WORK/sshd_config" <<EOF
Port $PORT
ListenAddress 127.0.0.1
HostKey $WORK/host_key
PidFile $WORK/sshd.pid
AuthorizedKeysFile $WORK/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
UseDNS no
Subsystem sftp /usr/lib/openssh/sftp-server
EOF
/usr/sbin/sshd -f "$WORK/sshd_config" -E "$WORK/sshd.log"
for _ in $(seq 50); do [ -f "$WORK/sshd.pid" ] && break; sleep 0.1; done
SSH_OPTS="-F /dev/null -p $PORT -i $WORK/client_key -o IdentitiesOnly=yes -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o BatchMode=yes -o LogLevel=ERROR"
export SHEAF_SSH="ssh $SSH_OPTS"
USER_AT="$(id -un)@127.0.0.1"

# Bytes the server's sftp-server processes have read from files so far.
served() {
  local s=0 p
  for p in $(pgrep -f /usr/lib/openssh/sftp-server || true); do
    s=$((s + $(awk '/^rchar/ { print $2 }' "/proc/$p/io" 2>/dev/null || echo 0)))
  done
  echo "$s"
}

# --- data -----------------------------------------------------------------------------------
if [ ! -f "$DATA/H5s/scan.h5" ]; then
  log "writing a ${H5_ROWS}x${H5_COLS} float64 HDF5 file"
  rm -rf "$DATA/H5s.tmp"; mkdir -p "$DATA/H5s.tmp"
  py_in "$DATA/P" "
import numpy as np, h5py
rng = np.random.default_rng(42)
with h5py.File('$DATA/H5s.tmp/scan.h5', 'w') as f:
    ds = f.create_dataset('x', shape=($H5_ROWS, $H5_COLS), dtype='f8')
    j = np.arange($H5_COLS)[None, :]
    for r in range(0, $H5_ROWS, 512):
        i = np.arange(r, r + 512)[:, None]
        ds[r:r + 512] = (np.sin(i * 0.003 + j * 0.002) + rng.normal(0, 0.01, (512, $H5_COLS))).astype(np.float32).astype(np.float64)
"
  rm -rf "$DATA/H5s"; mv "$DATA/H5s.tmp" "$DATA/H5s"
fi
mkdir -p "$WORK/img"
"$SHEAF" build -q "$DATA/H5s" -o "$WORK/img/H5.sheaf"
"$SHEAF" build -q "$DATA/P" -o "$WORK/img/P.sheaf"
H5_SUM=$(py_in "$DATA/P" "
import h5py
with h5py.File('$DATA/H5s/scan.h5', 'r') as f: print(repr(float(f['x'][1000:1000 + $H5_SLAB].sum())))")
HYPER="import h5py
with h5py.File('$MP/scan.h5', 'r') as f: print(repr(float(f['x'][1000:1000 + $H5_SLAB].sum())))"

# run KIND CASE: one cold run; prints "ns served ssh_bytes"
run() {
  local kind=$1 case=$2 s e b0 b1 sb=0 out
  drop
  b0=$(served)
  case $kind in
    sheaf-h5)  "$SHEAF" mount --no-cache ${OPT:+-o $OPT} "ssh://$USER_AT$WORK/img/H5.sheaf" "$MP" ;;
    sheaf-P)   "$SHEAF" mount --no-cache ${OPT:+-o $OPT} "ssh://$USER_AT$WORK/img/P.sheaf" "$MP" ;;
    sshfs-h5)  sshfs -o "ssh_command=ssh $SSH_OPTS" "$USER_AT:$DATA/H5s" "$MP" ;;
    sshfs-P)   sshfs -o "ssh_command=ssh $SSH_OPTS" "$USER_AT:$DATA/P" "$MP" ;;
  esac
  s=$(now)
  case $case in
    h5) out=$(py_in "$DATA/P" "$HYPER"); [ "$out" = "$H5_SUM" ] || die "$kind: hyperslab sum $out, expected $H5_SUM" ;;
    P) py_in "$MP" "$IMPORT" ;;
  esac
  e=$(now)
  b1=$(served)
  if [[ $kind == sheaf-* ]]; then
    sb=$("$SHEAF" stats --json "$MP" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["remote"]["ssh_bytes"])')
    "$SHEAF" umount "$MP"
  else
    fusermount3 -u "$MP"
  fi
  echo "$((e - s)) $((b1 - b0)) $sb"
}

declare -A T B S
for spec in "sheaf-h5 h5" "sheaf-h5:readahead=0 h5" "sshfs-h5 h5" "sheaf-P P" "sshfs-P P"; do
  read -r k c <<< "$spec"
  kind=${k%%:*}; OPT=""; [[ $k == *:* ]] && OPT=${k#*:}
  ts=() bs=() ss=()
  for _ in $(seq "$RUNS"); do
    read -r t b s <<< "$(run "$kind" "$c")"
    ts+=("$t"); bs+=("$b"); ss+=("$s")
  done
  T[$k]=$(median "${ts[@]}"); B[$k]=$(median "${bs[@]}"); S[$k]=$(median "${ss[@]}")
  log "$k: $(secs "${T[$k]}") s, server read $(mb "${B[$k]}") MB (sheaf counted $(mb "${S[$k]}") MB)"
done

H5_FILE=$(stat -c %s "$DATA/H5s/scan.h5")
P_IMG=$(stat -c %s "$WORK/img/P.sheaf")
{
  echo "# sheaf over ssh:// vs sshfs, $(date -u +%Y-%m-%d\ %H:%M) UTC"
  echo
  echo "$(nproc) cores, $(uname -r), $(ssh -V 2>&1), $(sshfs --version 2>&1 | head -1); sshd on 127.0.0.1 (unshaped"
  echo "loopback). Cold runs: fresh mount, page cache dropped, sheaf with --no-cache; medians of $RUNS."
  echo "'server read' = bytes the server's sftp-server read from files (/proc/PID/io rchar), for both."
  echo
  echo "| case | time s | server read MB | sheaf counted MB |"
  echo "|---|---|---|---|"
  for k in "sheaf-h5" "sheaf-h5:readahead=0" "sshfs-h5" "sheaf-P" "sshfs-P"; do
    echo "| $k | $(secs "${T[$k]}") | $(mb "${B[$k]}") | $(mb "${S[$k]}") |"
  done
  echo
  echo "h5: rows 1000..$((1000 + H5_SLAB)) of a ${H5_ROWS}x${H5_COLS} float64 dataset ($(mb "$H5_FILE") MB file; slab $(mb $((H5_SLAB * H5_COLS * 8))) MB);"
  echo "sums checked against the local file. P: \`$IMPORT\` from tree P (image $(mb "$P_IMG") MB)."
} > "$OUT"
log "wrote $OUT"
cat "$OUT"
