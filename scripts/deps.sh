#!/usr/bin/env bash
# Install what building, the demo, testing or benchmarking sheaf needs, only if missing (idempotent).
# Usage: scripts/deps.sh [build|demo|test|bench]   (default: test)
set -euo pipefail
# command per package; an empty command means "check with dpkg".
# Tiers: each includes the ones before it.
#   build  what `make build` needs: the compiler, protoc, FUSE, Python's venv
#   demo   what `make demo` shows: nginx (lazy HTTP), ssh-keygen (signing)
#   test   every real server and tool the tests start (the default)
#   bench  the competitors the benchmarks measure against
tier=${1:-test}
case "$tier" in build|demo|test|bench) ;; *) echo "usage: $0 [build|demo|test|bench]" >&2; exit 2 ;; esac
want=(build-essential:cc pkg-config:pkg-config tar:tar gzip:gzip zstd:zstd
      protobuf-compiler:protoc   # building sheaf-snapshotter (containerd's snapshots API)
      fuse3:fusermount3 util-linux:setpriv findutils:find diffutils:diff
      python3:python3 python3-pip: python3-venv:   # the Python package's wheel (scripts/pyenv.sh)
      libslurm-dev:)   # slurm/spank.h: the Slurm SPANK plugin (make spank, docs/slurm.md)
[ "$tier" = build ] || want+=(nginx-light:nginx openssh-client:ssh-keygen bc:bc)
case "$tier" in test|bench)
  want+=(xz-utils:xz bzip2:bzip2 squid:squid curl:curl openssh-server:/usr/sbin/sshd sshfs:sshfs rsync:rsync git:git
      man-db:man bash-completion: dpkg-dev:dpkg-shlibdeps   # tests/install.rs: man pages, bash completion, make deb
      libacl1-dev:   # libacl1-dev: pjdfstest (scripts/pjdfstest.sh) links libacl
      openmpi-bin:mpirun libopenmpi-dev:mpicc libclang-dev: lmod:  # sheaf bcast (rsmpi), pools
      python3-h5py:  # the HDF5-over-ssh test (Debian's /usr/bin/python3)
      docker-registry:docker-registry skopeo:skopeo umoci:umoci apache2-utils:htpasswd   # container images (tests/containers.rs; htpasswd: a registry with basic auth)
      containerd:containerd runc:runc python3-grpcio:  # tests/snapshotter.rs (a CRI pull from Debian's python3)
      systemd:systemd-socket-activate   # tests/snapshotter.rs: socket activation and systemd-analyze verify of the units
      iproute2:ip iptables:iptables  # network namespaces (bench/cluster.sh); bytes counted by the kernel (tests/s3.rs)
      slurmctld:slurmctld slurmd:slurmd slurm-client:srun munge:munged)  # a Slurm cluster of namespaced nodes (scripts/slurm-cluster.sh, tests/slurm.rs)
esac
if [ "$tier" = bench ]; then want+=(squashfs-tools:mksquashfs squashfs-tools-ng:tar2sqfs erofs-utils:mkfs.erofs time:/usr/bin/time squashfuse:squashfuse_ll
               fuse-overlayfs:fuse-overlayfs mmdebstrap:mmdebstrap); fi
missing=()
for w in "${want[@]}"; do
  pkg=${w%%:*}; cmd=${w#*:}
  if [ -n "$cmd" ]; then
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
  else
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The tests start squid themselves (own config, port and service name); a
  # system squid the package may have started is not wanted.
  if [[ " ${missing[*]} " == *" squid "* ]]; then
    $SUDO service squid stop >/dev/null 2>&1 || true
  fi
  # Likewise containerd: the tests start their own (own config and sockets).
  if [[ " ${missing[*]} " == *" containerd "* ]]; then
    $SUDO service containerd stop >/dev/null 2>&1 || true
    if [ -d /run/systemd/system ]; then
      $SUDO systemctl disable --now containerd.service >/dev/null 2>&1 || true
    fi
  fi
  # Likewise munge and Slurm: scripts/slurm-cluster.sh starts its own.
  for svc in slurmctld slurmd munge; do
    if [[ " ${missing[*]} " == *" $svc "* ]]; then
      $SUDO service "$svc" stop >/dev/null 2>&1 || true
      if [ -d /run/systemd/system ]; then
        $SUDO systemctl disable --now "$svc.service" >/dev/null 2>&1 || true
      fi
    fi
  done
  # Likewise sshd: the tests start their own (own config, keys, loopback port);
  # the system one the package may have started on port 22 must not stay.
  if [[ " ${missing[*]} " == *" openssh-server "* ]]; then
    $SUDO service ssh stop >/dev/null 2>&1 || true
    if [ -d /run/systemd/system ]; then
      $SUDO systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
    fi
  fi
fi
# SeaweedFS's `weed` (tests/s3.rs: a real S3 server with authentication),
# built from its Go module at one pinned version. `go install mod@version`
# refuses it (its go.mod has a replace directive), so the module is
# downloaded and built in a scratch copy. Several minutes on 2 cores.
WEED_VERSION=v0.0.0-20261109003541-7506e5f91cd6
if [[ $tier == test || $tier == bench ]] && ! command -v weed >/dev/null 2>&1; then
  PATH=$PATH:/usr/local/go/bin
  if ! command -v go >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get install -y -qq --no-install-recommends golang-go >/dev/null
  fi
  echo "deps: building weed (SeaweedFS $WEED_VERSION)" >&2
  mod=$(cd / && GOFLAGS=-mod=mod go mod download -json "github.com/seaweedfs/seaweedfs@$WEED_VERSION" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  scratch=$(mktemp -d)
  cp -r "$mod/." "$scratch/" && chmod -R u+w "$scratch"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  (cd "$scratch" && GOTOOLCHAIN=auto go build -o "$scratch/weed.bin" ./weed)
  $SUDO install -m 0755 "$scratch/weed.bin" /usr/local/bin/weed
  rm -rf "$scratch"
fi
if ! command -v cargo >/dev/null 2>&1; then
  for d in "$HOME/.cargo/bin" /usr/local/cargo/bin; do [ -x "$d/cargo" ] && exit 0; done
  echo "deps: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
