#!/usr/bin/env bash
# Run every cargo-fuzz target for N seconds each (default 60), seeded with
# real images so the fuzzer starts from valid structure.
#   FUZZ_RUNS=N        stop each target after N executions instead (e.g. 10000000)
#   FUZZ_TARGETS="..." a subset of the targets
#   FUZZ_SANITIZER=none  no AddressSanitizer: the oci target (which imports,
#                      publishes and flattens every input) runs ~8x faster;
#                      safe Rust panics are still caught (default: address)
# Targets that write files (oci) use a tmpfs scratch directory when there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
targets=${FUZZ_TARGETS:-records codecs image catalogue sftp oci documents tar}
san=${FUZZ_SANITIZER:-address}
[ -d /dev/shm ] && [ -w /dev/shm ] && export TMPDIR=/dev/shm
export PATH="$HOME/.cargo/bin:$PATH"
rustup toolchain list | grep -q nightly || { echo "fuzz: needs a nightly toolchain (rustup toolchain install nightly)" >&2; exit 1; }
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
cargo build --release --locked
mkdir -p fuzz/corpus/image fuzz/corpus/records fuzz/corpus/codecs fuzz/corpus/catalogue fuzz/corpus/sftp fuzz/corpus/oci fuzz/corpus/documents fuzz/corpus/tar
seed=$(mktemp -d); trap 'rm -rf "$seed"' EXIT
mkdir -p "$seed/t/d"; echo hello > "$seed/t/a"; ln -s a "$seed/t/l"; seq 1 3000 > "$seed/t/d/n"
for c in zstd lz4 xz none; do
  target/release/sheaf build "$seed/t" -o "fuzz/corpus/image/seed-$c.sheaf" -c "$c" --block-size 4K --page-size 4K --force -q
done
head -c 300 fuzz/corpus/image/seed-zstd.sheaf > fuzz/corpus/records/seed
printf '\x00\x00\x00\x03\x00\x00\x00\x12limits@openssh.com\x00\x00\x00\x01\x31' > fuzz/corpus/sftp/seed
printf '{"sheaf_pools": 1, "pools": [{"pool": "a/1", "form": "image", "source": "a/1.sheaf"}]}' > fuzz/corpus/catalogue/seed
# A layer tar (kind byte 2), a manifest (0) and a config (1).
{ printf '\x02'; tar -cf - -C "$seed" t; } > fuzz/corpus/oci/seed-layer
printf '\x00{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%064d","size":1,"platform":{"os":"linux","architecture":"amd64"}}]}' 0 > fuzz/corpus/oci/seed-index
printf '\x01{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"config":{"User":"app:staff","Env":["A=1"],"Cmd":["sh"]}}\napp:x:1:2::/:/bin/sh\nstaff:x:50:\n' > fuzz/corpus/oci/seed-config
# Kept seeds (a small minimized corpus in the repository) start each run.
# Build input from tar (kind byte 0: an archive): the seed tree.
{ printf '\x00'; tar -cf - -C "$seed" t; } > fuzz/corpus/tar/seed-tree
for t in catalogue sftp oci codecs documents tar; do cp -n fuzz/seeds/$t/* fuzz/corpus/$t/ 2>/dev/null || true; done
for t in $targets; do
  if [ -n "${FUZZ_RUNS:-}" ]; then
    echo "fuzz: $t for $FUZZ_RUNS executions (sanitizer $san)" >&2
    stop=(-runs="$FUZZ_RUNS")
  else
    echo "fuzz: $t for ${secs}s (sanitizer $san)" >&2
    stop=(-max_total_time="$secs")
  fi
  cargo +nightly fuzz run -O -s "$san" "$t" "fuzz/corpus/$t" -- "${stop[@]}" -rss_limit_mb=2048 -max_len=262144 -print_final_stats=1
done
