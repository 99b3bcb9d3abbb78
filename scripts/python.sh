#!/usr/bin/env bash
# The sheaf Python package (crates/sheaf-py): build its wheel, or test it.
#   scripts/python.sh wheel   build target/wheels/sheaf-VERSION-cp39-abi3-*.whl
#   scripts/python.sh test    install that wheel in the venv, run the pytest suite
# The venv (scripts/pyenv.sh) holds maturin, pytest and the real packages the
# tests read images with. PYTEST_ARGS passes more arguments to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
venv=${SHEAF_PYENV:-target/pyenv}
target=${CARGO_TARGET_DIR:-target}
wheels="$target/wheels"
# The wheel needs only maturin; the tests the whole list.
if [ "${1:-}" = test ]; then scripts/pyenv.sh "$venv" test; else scripts/pyenv.sh "$venv" wheel; fi
wheel() {
  # Built for the lowest CPython the abi3 wheel supports; the venv's
  # interpreter only runs maturin.
  "$venv/bin/maturin" build --release --locked -q -m crates/sheaf-py/Cargo.toml \
    -i "$venv/bin/python" --out "$wheels" >/dev/null
  ls -t "$wheels"/sheaf-*-abi3-*.whl | head -1
}
case "${1:-}" in
  wheel) wheel ;;
  test)
    w=$(wheel)   # cargo's incremental build: quick when nothing changed
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$w"
    SHEAF_WHEEL="$w" "$venv/bin/python" -m pytest crates/sheaf-py/tests -p no:cacheprovider ${PYTEST_ARGS:-}
    ;;
  *) echo "usage: $0 wheel|test" >&2; exit 2 ;;
esac
