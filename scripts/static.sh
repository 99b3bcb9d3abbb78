#!/usr/bin/env bash
# A fully static sheaf (musl): target/static/sheaf and target/static/sheaf-full,
# for clusters where users have no root and no matching C library. Then a
# smoke test of the binaries themselves, with an empty environment: build an
# image, list it, mount it (FUSE), read a file back, unmount.
# Left out: MPI (`sheaf bcast` copies locally; a site's MPI cannot be linked
# statically), and glibc's malloc arena tuning. Usage: scripts/static.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$HOME/.cargo/bin:$PATH
target=x86_64-unknown-linux-musl
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
if ! command -v musl-gcc >/dev/null 2>&1; then
  echo "static: installing musl-tools (musl-gcc, for the C parts: zstd, xz)" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends musl-tools >/dev/null
fi
if command -v rustup >/dev/null 2>&1; then
  rustup target list --installed | grep -qx "$target" || rustup target add "$target"
elif ! rustc --print target-libdir --target "$target" >/dev/null 2>&1; then
  echo "static: the Rust standard library for $target is missing (rustup target add $target)" >&2
  exit 1
fi
CARGO_TARGET_DIR=target/static cargo build --release --locked --target "$target" -p sheaf-cli --bins
out=target/static
for b in sheaf sheaf-full; do
  install -m 755 "$out/$target/release/$b" "$out/$b"
done

# The smoke test: static (no interpreter, no libraries), and working.
for b in "$out/sheaf" "$out/sheaf-full"; do
  if readelf -l "$b" | grep -q 'Requesting program interpreter' || readelf -d "$b" | grep -q NEEDED; then
    echo "static: $b is not static" >&2; readelf -d "$b" | grep NEEDED >&2 || true; exit 1
  fi
done
work=$(mktemp -d)
mp=$work/mnt
cleanup() { fusermount3 -u "$mp" 2>/dev/null || umount "$mp" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/src/sub" "$mp"
head -c 300000 /dev/urandom > "$work/src/sub/data.bin"
echo "static hello" > "$work/src/hello.txt"
sheaf=$(realpath "$out/sheaf")
env -i "$sheaf" build -q "$work/src" -o "$work/t.sheaf"
env -i "$sheaf" ls "$work/t.sheaf" sub | grep -qx data.bin
env -i "$sheaf" mount "$work/t.sheaf" "$mp"
cmp "$work/src/sub/data.bin" "$mp/sub/data.bin"
[ "$(cat "$mp/hello.txt")" = "static hello" ]
env -i "$sheaf" umount "$mp"
if grep -q " $mp " /proc/mounts; then echo "static: $mp still mounted" >&2; exit 1; fi
printf 'static: %s (%s) and %s (%s): built, listed, mounted and read back\n' \
  "$out/sheaf" "$(du -h "$out/sheaf" | cut -f1)" "$out/sheaf-full" "$(du -h "$out/sheaf-full" | cut -f1)"
