#!/usr/bin/env bash
# The Python environment the sheaf Python package is built and tested in
# (crates/sheaf-py): a venv with maturin, pytest and the real packages the
# tests read images with. Idempotent: packages already at the wanted
# versions are not fetched again. Prints nothing on success but pip's errors.
# Usage: scripts/pyenv.sh [VENV] [wheel|test]   (default: target/pyenv test)
#   wheel  maturin only (what `make build` needs to build the wheel)
#   test   maturin, pytest and the packages the tests read images with
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-${SHEAF_PYENV:-target/pyenv}}
py=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
tier=${2:-test}
want=(maturin)
[ "$tier" = wheel ] || want+=(pytest numpy h5py "zarr>=3" xarray h5netcdf pandas pyarrow nibabel fsspec aiohttp requests paramiko)

# The list changes rarely: a stamp of it skips pip when nothing changed.
# A test venv also serves a wheel build.
stamp="$venv/.sheaf-packages"
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" != "${want[*]}" ] && ! { [ "$tier" = wheel ] && [[ " $have " == *" maturin "* ]]; }; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${want[@]}"
  echo "${want[*]}" > "$stamp"
fi
