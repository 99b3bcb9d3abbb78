"""The wheel `make build` makes installs into a fresh venv and works there."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

from conftest import build, write_tree


def test_the_wheel_installs_into_a_fresh_venv(tmp_path):
    wheel = os.environ.get("SHEAF_WHEEL")
    assert wheel and Path(wheel).is_file(), "SHEAF_WHEEL: the wheel to test (scripts/python.sh test sets it)"
    name = Path(wheel).name
    assert "-cp39-abi3-" in name, f"{name}: not one abi3 wheel for CPython >= 3.9"
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    r = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-index", "--disable-pip-version-check", wheel],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    img = build(write_tree(tmp_path / "t", {"hello.txt": b"hello\n"}), tmp_path / "t.sheaf")
    code = (
        "import sheaf, importlib.metadata as m\n"
        f"im = sheaf.open({str(img)!r})\n"
        "assert im.read_many(['hello.txt']) == [b'hello\\n']\n"
        "eps = [e.value for e in m.entry_points(group='fsspec.specs') if e.name == 'sheaf']\n"
        "assert eps == ['sheaf.fsspec:SheafFileSystem'], eps\n"
        "print(sheaf.__version__, sheaf.__file__)\n"
    )
    env = {"PATH": str(env_dir / "bin"), "HOME": str(tmp_path), "SHEAF_CONFIG": os.environ["SHEAF_CONFIG"]}
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert str(env_dir) in r.stdout
    assert sys.version_info >= (3, 9)
