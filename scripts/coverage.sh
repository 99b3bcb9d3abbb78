#!/usr/bin/env bash
# Line coverage of one crate's files from its unit tests alone (not part of
# make check: it needs rustup's llvm-tools component). Only the named crate
# is instrumented (a rustc wrapper adds -C instrument-coverage to it), in a
# target directory of its own.
#
#   scripts/coverage.sh sheaf-mount src/fs/ops.rs src/union/ops.rs
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
crate=$1
shift
tools="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin"
if [ ! -x "$tools/llvm-cov" ]; then
    echo "coverage.sh: no llvm-cov; rustup component add llvm-tools" >&2
    exit 1
fi
export CARGO_TARGET_DIR="${COVERAGE_TARGET_DIR:-$PWD/target/coverage}"
mkdir -p "$CARGO_TARGET_DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# At a fixed path: cargo rebuilds everything when the wrapper moves.
wrap="$CARGO_TARGET_DIR/coverage-rustc"
cat > "$wrap" <<WRAP
#!/bin/sh
case " \$* " in
*" --crate-name ${crate//-/_} "*) exec "\$@" -C instrument-coverage ;;
esac
exec "\$@"
WRAP
chmod +x "$wrap"
RUSTC_WRAPPER="$wrap" LLVM_PROFILE_FILE="$work/%p-%m.profraw" \
    cargo test --locked -p "$crate" --lib
exe=$(RUSTC_WRAPPER="$wrap" cargo test --locked -p "$crate" --lib --no-run \
    --message-format=json 2>/dev/null | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
"$tools/llvm-profdata" merge -sparse "$work"/*.profraw -o "$work/all.profdata"
"$tools/llvm-cov" report "$exe" -instr-profile="$work/all.profdata" \
    "${@/#/crates/$crate/}"
