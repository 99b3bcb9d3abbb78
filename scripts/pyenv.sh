#!/usr/bin/env bash
# The Python environment the sheaf Python package is built and tested in
# (crates/sheaf-py): a venv with maturin, pytest and the real packages the
# tests read images with. Idempotent: packages already at the wanted
# versions are not fetched again. Prints nothing on success but pip's errors.
# Usage: scripts/pyenv.sh [VENV]   (default: target/pyenv)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-${SHEAF_PYENV:-target/pyenv}}
py=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
want=(maturin pytest numpy h5py "zarr>=3" xarray h5netcdf pandas pyarrow nibabel fsspec aiohttp requests paramiko)
# The list changes rarely: a stamp of it skips pip when nothing changed.
stamp="$venv/.sheaf-packages"
if [ "$(cat "$stamp" 2>/dev/null)" != "${want[*]}" ]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${want[@]}"
  echo "${want[*]}" > "$stamp"
fi
