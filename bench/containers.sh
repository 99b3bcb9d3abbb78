#!/usr/bin/env bash
# Lazy container starts (issue 14 §5): time from "pull" to the container's first output,
# and bytes moved, through a real containerd (CRI pull, as the kubelet pulls; then ctr run
# with runc), for two images built here from Debian with mmdebstrap + umoci:
#   py   minbase + python3                       (2 layers)   cmd: python3 -c 'print(1)'
#   sci  py + python3-numpy/scipy                (3 layers)   cmd: python3 -c 'import numpy, scipy.linalg; print(1)'
# Modes, each on a fresh containerd (new root) after drop_caches, medians of RUNS:
#   overlayfs    containerd's default snapshotter: every layer blob downloaded and unpacked
#   sheaf-cold   sheaf snapshotter, layers imported into a repository served by nginx,
#                empty node cache: only the blocks read are fetched
#   sheaf-prefetch  sheaf-cold plus a recorded prefetch list in the repository
#                (REPO/prefetch-sha256-MANIFEST.txt, recorded here by running the command in
#                a record= mount of the flattened image): fetched into the node cache at pull
#   sheaf-warm   the same with the node cache of a previous run: no layer bytes
# Bytes: layer blobs from the registry (its access log), and repository bytes from nginx
# (its access log, $body_bytes_sent). Writes bench/results/DATE-containers.md.
#
# Usage: bench/containers.sh   (root)
# Env:   IMPORT_FLAGS: packing flags for `sheaf import` (default: its own, 256K packs;
#        "--pack-size 4M" gives the builder's default)
# Env:   SHEAF_BENCH_DATA (default /var/tmp/sheaf-bench; images cached in containers/),
#        RUNS (default 3)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHEAF=${SHEAF:-$ROOT/target/release/sheaf}
DATA=${SHEAF_BENCH_DATA:-/var/tmp/sheaf-bench}
RUNS=${RUNS:-3}
PY=/usr/bin/python3
OUT=$ROOT/bench/results/$(date +%Y-%m-%d-%H%M)-containers.md
log() { printf '[containers-bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (containerd, drop_caches)"
[ -x "$SHEAF" ] || die "$SHEAF missing: run make build"
for p in mmdebstrap umoci skopeo docker-registry containerd ctr runc nginx rsync; do
  command -v $p >/dev/null || die "$p missing (scripts/deps.sh bench)"
done
$PY -c 'import grpc' 2>/dev/null || die "python3-grpcio missing"

IMG=$DATA/containers; mkdir -p "$IMG"
# --- images (cached) ---------------------------------------------------------------------
mk_tar() { # NAME PACKAGES
  [ -s "$IMG/$1.tar" ] && return
  log "mmdebstrap $1 (${2:-minbase})"
  mmdebstrap --quiet --variant=minbase ${2:+--include=$2} bookworm "$IMG/$1.tar.part"
  mv "$IMG/$1.tar.part" "$IMG/$1.tar"
}
mk_tar base ""
mk_tar py python3
mk_tar sci python3,python3-numpy,python3-scipy
if [ ! -f "$IMG/oci/index.json" ]; then
  log "umoci: layers base -> py -> sci"
  rm -rf "$IMG/oci" "$IMG/bundle" "$IMG/root"
  umoci init --layout "$IMG/oci" && umoci new --image "$IMG/oci:py"
  umoci unpack --image "$IMG/oci:py" "$IMG/bundle" >/dev/null
  for step in base py; do
    rm -rf "$IMG/root" && mkdir "$IMG/root" && tar -xf "$IMG/$step.tar" -C "$IMG/root"
    rsync -aHAX --delete "$IMG/root/" "$IMG/bundle/rootfs/"
    umoci repack --image "$IMG/oci:py" "$IMG/bundle"
  done
  umoci config --image "$IMG/oci:py" --config.cmd python3 --config.cmd=-c --config.cmd="print(1)"
  umoci unpack --image "$IMG/oci:py" "$IMG/bundle2" >/dev/null
  rm -rf "$IMG/root" && mkdir "$IMG/root" && tar -xf "$IMG/sci.tar" -C "$IMG/root"
  rsync -aHAX --delete "$IMG/root/" "$IMG/bundle2/rootfs/"
  umoci repack --image "$IMG/oci:sci" "$IMG/bundle2"
  umoci config --image "$IMG/oci:sci" --config.cmd python3 --config.cmd=-c --config.cmd="import numpy, scipy.linalg; print(1)"
  umoci gc --layout "$IMG/oci"
  rm -rf "$IMG/root" "$IMG/bundle" "$IMG/bundle2"
fi

WORK=$(mktemp -d "$DATA/ctr.XXXXXX")
PIDS=()
cleanup() {
  for s in "$WORK"/ctd*/containerd.sock; do
    [ -S "$s" ] || continue
    for t in $(ctr -a "$s" -n k8s.io task ls -q 2>/dev/null); do ctr -a "$s" -n k8s.io task kill -s KILL "$t" 2>/dev/null || true; done
  done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  { grep " $WORK" /proc/self/mountinfo || true; } | awk '{print $5}' | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  pkill -f "containerd-shim.*$WORK" 2>/dev/null || true
  rm -rf "$WORK"
  return 0
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM
free_port() { $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; die "port $1 not open"; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# --- registry and repository -------------------------------------------------------------
RPORT=$(free_port)
cat > "$WORK/registry.yml" <<EOF
version: 0.1
log: {level: info, accesslog: {disabled: false}}
storage: {filesystem: {rootdirectory: $WORK/registry}}
http: {addr: 127.0.0.1:$RPORT}
EOF
docker-registry serve "$WORK/registry.yml" > "$WORK/registry.log" 2>&1 & PIDS+=($!)
wait_port "$RPORT"
REG=127.0.0.1:$RPORT
for t in py sci; do skopeo copy -q --dest-tls-verify=false "oci:$IMG/oci:$t" "docker://$REG/bench:$t"; done
mkdir -p "$WORK/www"
for t in py sci; do
  # shellcheck disable=SC2086
  "$SHEAF" import "docker://$REG/bench:$t" --insecure-registry "$REG" --publish "$WORK/www/repo" -q ${IMPORT_FLAGS:-}
done
# The prefetch lists: each image's command run once in a record= mount of its flattened
# image (made from the repository's layers); kept aside until the sheaf-prefetch runs.
declare -A CMD=([py]="print(1)" [sci]="import numpy, scipy.linalg; print(1)") MANIFEST
for t in py sci; do
  MANIFEST[$t]=$(skopeo inspect --tls-verify=false --raw "docker://$REG/bench:$t" | sha256sum | cut -d' ' -f1)
  "$SHEAF" import "docker://$REG/bench:$t" --insecure-registry "$REG" --publish "$WORK/www/repo" --flatten -o "$WORK/$t.flat.sheaf" -q
  mkdir -p "$WORK/rec-$t"
  "$SHEAF" mount "$WORK/$t.flat.sheaf" "$WORK/rec-$t" -o "record=$WORK/$t.list"
  chroot "$WORK/rec-$t" python3 -c "${CMD[$t]}" >/dev/null
  "$SHEAF" umount "$WORK/rec-$t"
  log "$t: prefetch list of $(wc -l < "$WORK/$t.list") files"
done
NPORT=$(free_port); mkdir -p "$WORK/nginx-tmp"
cat > "$WORK/nginx.conf" <<EOF
daemon off; master_process off; pid $WORK/nginx-tmp/nginx.pid; error_log $WORK/nginx-tmp/error.log;
events { worker_connections 1024; }
http { log_format b '\$body_bytes_sent'; access_log $WORK/nginx-access.log b; sendfile on;
       client_body_temp_path $WORK/nginx-tmp; proxy_temp_path $WORK/nginx-tmp;
       fastcgi_temp_path $WORK/nginx-tmp; uwsgi_temp_path $WORK/nginx-tmp; scgi_temp_path $WORK/nginx-tmp;
       server { listen 127.0.0.1:$NPORT; root $WORK/www; } }
EOF
nginx -e "$WORK/nginx-tmp/error.log" -c "$WORK/nginx.conf" </dev/null & PIDS+=($!)
wait_port "$NPORT"
REPO_URL=http://127.0.0.1:$NPORT/repo

registry_layer_bytes() { # lines from N on: bytes of blob GETs other than the config
  tail -n +"$1" "$WORK/registry.log" | grep -o '"GET /v2/[^"]*/blobs/[^"]*" 200 [0-9]*' | awk '{s += $NF} END {print s + 0}'
}
nginx_bytes() { tail -n +"$1" "$WORK/nginx-access.log" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
lines() { wc -l < "$1" 2>/dev/null || echo 0; }

# One start: fresh containerd (and snapshotter), drop caches, CRI pull + run; prints "secs layer_bytes repo_bytes output".
one() { # MODE TAG RUN CACHE
  local mode=$1 tag=$2 run=$3 cache=$4 d=$WORK/ctd-$1-$2-$3 snapsock="" snapname=overlayfs sn_pid=""
  mkdir -p "$d"
  if [ "$mode" != overlayfs ]; then
    snapsock=$d/sheaf.sock; snapname=sheaf
    SHEAF_CACHE_DIR=$cache "$SHEAF" snapshotter --socket "$snapsock" --root "$d/sn" --repo "$REPO_URL" > "$d/sn.log" 2>&1 & sn_pid=$!; PIDS+=($sn_pid)
    for _ in $(seq 100); do [ -S "$snapsock" ] && break; sleep 0.05; done
  fi
  cat > "$d/config.toml" <<EOF
version = 2
root = "$d/root"
state = "$d/state"
[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
$( [ -n "$snapsock" ] && printf '[proxy_plugins]\n  [proxy_plugins.sheaf]\n    type = "snapshot"\n    address = "%s"\n' "$snapsock" )
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "$snapname"
    disable_snapshot_annotations = false
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."$REG"]
    endpoint = ["http://$REG"]
EOF
  containerd --config "$d/config.toml" > "$d/containerd.log" 2>&1 & local cpid=$!; PIDS+=($cpid)
  for _ in $(seq 200); do ctr -a "$d/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.05; done
  local rl nl t0 t1 out
  rl=$(lines "$WORK/registry.log"); nl=$(lines "$WORK/nginx-access.log")
  drop_caches
  t0=$(date +%s%N)
  $PY "$ROOT/crates/sheaf-cli/tests/support/cri_pull.py" "$d/containerd.sock" "$REG/bench:$tag" >/dev/null
  out=$(ctr -a "$d/containerd.sock" -n k8s.io run --rm --snapshotter "$snapname" "$REG/bench:$tag" "c$run" | head -n 1)
  t1=$(date +%s%N)
  echo "$(( (t1 - t0) / 1000000 )) $(registry_layer_bytes $((rl + 1))) $(nginx_bytes $((nl + 1))) $out"
  kill "$cpid"; wait "$cpid" 2>/dev/null || true
  [ -n "$sn_pid" ] && { kill "$sn_pid"; wait "$sn_pid" 2>/dev/null || true; }
  { grep " $d" /proc/self/mountinfo || true; } | awk '{print $5}' | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
}

declare -A R
for tag in py sci; do
  for mode in overlayfs sheaf-cold sheaf-prefetch sheaf-warm; do
    ms=(); lb=(); rb=()
    list=$WORK/www/repo/prefetch-sha256-${MANIFEST[$tag]}.txt
    if [ "$mode" = sheaf-prefetch ]; then cp "$WORK/$tag.list" "$list"; else rm -f "$list"; fi
    warm=$WORK/cache-warm-$tag
    if [ "$mode" = sheaf-warm ]; then one sheaf-cold "$tag" prime "$warm" >/dev/null; fi
    for r in $(seq "$RUNS"); do
      cache=$WORK/cache-$mode-$tag-$r; [ "$mode" = sheaf-warm ] && cache=$warm
      read -r t l b o < <(one "$mode" "$tag" "$r" "$cache")
      [ "$o" = 1 ] || die "$mode $tag: the container printed '$o', not 1"
      ms+=("$t"); lb+=("$l"); rb+=("$b")
      log "$tag $mode run $r: ${t} ms, layer blobs ${l} B, repository ${b} B"
    done
    R[$tag,$mode,t]=$(median "${ms[@]}"); R[$tag,$mode,l]=$(median "${lb[@]}"); R[$tag,$mode,b]=$(median "${rb[@]}")
  done
done

size_of() { skopeo inspect --tls-verify=false --raw "docker://$REG/bench:$1" | $PY -c 'import json,sys; print(sum(l["size"] for l in json.load(sys.stdin)["layers"]))'; }
{
  echo "# Container starts: containerd overlayfs (full pull) vs the sheaf snapshotter"
  echo
  echo "$(date -u +%Y-%m-%d\ %H:%M) UTC, $(nproc) cores; $(containerd --version | awk '{print $1, $3}'), runc $(runc --version | awk 'NR==1{print $3}'), docker-registry and nginx on 127.0.0.1 (no shaping); sheaf $(git -C "$ROOT" rev-parse --short HEAD). Medians of $RUNS, each on a fresh containerd after drop_caches: CRI PullImage, then \`ctr run --rm\` of the image's command; time until it has printed. Layers imported with \`sheaf import ${IMPORT_FLAGS:-(default packing)}\`."
  echo
  echo "| image | compressed layers | mode | pull → first output | blob bytes from the registry (config included) | bytes from the sheaf repository | ratio of time to overlayfs |"
  echo "|---|---|---|---|---|---|---|"
  for tag in py sci; do
    total=$(size_of "$tag")
    for mode in overlayfs sheaf-cold sheaf-prefetch sheaf-warm; do
      printf '| %s | %s B | %s | %s ms | %s B | %s B (%.1f%% of compressed) | %.2f |\n' "$tag" "$total" "$mode" "${R[$tag,$mode,t]}" "${R[$tag,$mode,l]}" "${R[$tag,$mode,b]}" \
        "$(echo "100 * ${R[$tag,$mode,b]} / $total" | bc -l)" "$(echo "${R[$tag,$mode,t]} / ${R[$tag,overlayfs,t]}" | bc -l)"
    done
  done
  echo
  echo "Targets (issue 14): first output >= 3x sooner than a full pull for the larger image; bytes fetched at start <= 10% of the compressed image; with a warm cache, no layer bytes."
} > "$OUT"
cat "$OUT"
log "wrote $OUT"
