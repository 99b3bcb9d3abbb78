"""Every ```python block of docs/python.md and of the README runs, as a
reader would paste it, in a clean venv holding the wheel alone plus the
third-party packages the snippet itself uses (never aiohttp, requests,
paramiko or s3fs: sheaf reads https://, ssh:// and s3:// itself). The
example names are replaced by real things the test makes: an image with the
files the snippets name (in the working directory, so `dataset.sheaf` and
`hcp.sheaf` are found as written), a real nginx for `https://host/...`, a
real SeaweedFS S3 store for `s3://bucket/...`, a signed image and its
allowed_signers. A new block this file does not know fails
`test_every_python_snippet_is_known`; a block that cannot run here would be
listed in NOT_RUN with the reason (none is).

Also here, issue 54's chained-URL case: `sheaf://PATH::https://...` in a
venv with fsspec and pandas but no aiohttp and no requests."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import h5netcdf  # noqa: F401 - xarray's engine, to write the netCDF file
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

from conftest import ROOT, Nginx, build, run, sheaf_bin, write_tree

DOCS = ROOT / "docs" / "python.md"
README = ROOT / "README.md"

# What must never be in a clean venv: the packages fsspec's own http, sftp
# and s3 filesystems need, which sheaf does not.
ABSENT = ("aiohttp", "requests", "paramiko", "s3fs")


def python_blocks(path: Path):
    """(first code line, code) of each ```python block."""
    out, block = [], None
    for line in path.read_text().splitlines():
        if block is None:
            if line.strip() == "```python":
                block = []
        elif line.strip() == "```":
            code = "\n".join(block) + "\n"
            first = next(x for x in block if x.strip())
            out.append((first.strip(), code))
            block = None
        else:
            block.append(line)
    return out


# Each block, by its first line: the pip requirements beyond the wheel (what
# the snippet imports, and xarray's engine it names), and the check run
# after it (the snippet's own names, against what the test wrote).
SNIPPETS = {
    ("python.md", "import sheaf, stat"): dict(reqs=[], check="check_api"),
    ("python.md", 'sheaf.open("stack.sheaf", require_signature=True, signers="/etc/sheaf/allowed_signers",'): dict(
        reqs=[], check="check_policy", prelude="import sheaf  # from the block above\n"
    ),
    ("python.md", "import fsspec, pandas as pd, xarray as xr, zarr"): dict(
        reqs=["fsspec", "pandas", "xarray", "h5netcdf", "h5py", "zarr>=3", "pyarrow"], check="check_fsspec"
    ),
    ("python.md", "import io, numpy as np, sheaf"): dict(reqs=["numpy", "pillow"], check="check_training"),
    ("README.md", "import sheaf, fsspec, pandas as pd"): dict(reqs=["fsspec", "pandas"], check="check_readme"),
}
NOT_RUN: dict = {}


def all_blocks():
    return [(DOCS.name, first, code) for first, code in python_blocks(DOCS)] + [
        (README.name, first, code) for first, code in python_blocks(README)
    ]


def test_every_python_snippet_is_known():
    found = [(f, first) for f, first, _ in all_blocks()]
    assert len(found) == len(set(found)), "two blocks begin alike: give one another first line"
    unknown = [k for k in found if k not in SNIPPETS and k not in NOT_RUN]
    assert not unknown, f"python blocks this test does not run (add them to SNIPPETS): {unknown}"
    gone = [k for k in SNIPPETS if k not in found]
    assert not gone, f"SNIPPETS names blocks no longer in the docs: {gone}"
    # The README's block is its "From Python" section's.
    readme = README.read_text()
    assert readme.index("## From Python") < readme.index("```python")


def literal_asserts(code: str) -> str:
    """`EXPR   # [literal], words` at the top level becomes an assertion
    that EXPR equals the literal the comment shows."""
    out = []
    for line in code.splitlines():
        if not line.startswith((" ", "\t")) and "  # [" in line:
            expr, comment = line.split("  # ", 1)
            lit = comment.split("]", 1)[0] + "]"
            try:
                ast.parse(expr.strip(), mode="eval")
                want = ast.literal_eval(lit)
            except (SyntaxError, ValueError):
                out.append(line)
                continue
            line = f"assert ({expr.strip()}) == {want!r}, ({expr.strip()!r}, {expr.strip()})"
        out.append(line)
    return "\n".join(out) + "\n"


# --- the things the snippets name -------------------------------------------


class Venvs:
    """Clean venvs, one per set of requirements, made once per session."""

    def __init__(self, base: Path, wheel: str):
        self.base, self.wheel, self.made = base, wheel, {}

    def get(self, reqs) -> Path:
        key = tuple(sorted(reqs))
        if key not in self.made:
            d = self.base / f"venv{len(self.made)}"
            venv.EnvBuilder(with_pip=True).create(d)
            py = d / "bin" / "python"
            r = subprocess.run(
                [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", self.wheel, *key],
                capture_output=True,
                text=True,
            )
            assert r.returncode == 0, r.stderr
            probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
            r = subprocess.run([py, "-c", probe, *ABSENT], capture_output=True, text=True)
            assert r.returncode == 0 and r.stdout.strip() == "[]", f"not a clean venv: {r.stdout}{r.stderr}"
            self.made[key] = py
        return self.made[key]


@pytest.fixture(scope="session")
def venvs(tmp_path_factory):
    wheel = os.environ.get("SHEAF_WHEEL")
    assert wheel and Path(wheel).is_file(), "SHEAF_WHEEL: the wheel to test (scripts/python.sh test sets it)"
    return Venvs(tmp_path_factory.mktemp("venvs"), wheel)


JPEGS = """
import sys, pathlib
from PIL import Image
root = pathlib.Path(sys.argv[1])
for c, color in (("cat", (200, 30, 30)), ("dog", (30, 200, 30)), ("emu", (30, 30, 200))):
    for i in range(4):
        p = root / "train" / c / f"{c}{i}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8 + i, 6), color).save(p, "JPEG")
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory, venvs):
    """The images, servers and files the snippets name, in one directory
    that is each snippet's working directory."""
    d = tmp_path_factory.mktemp("docs")
    src = d / "src"
    r = np.random.default_rng(54)
    files = {
        "sub-01/anat/T1w.json": b'{"RepetitionTime": 2.3}\n',
        "sub-01/anat/T1w.nii.gz": r.bytes(12 << 20),  # > 10M for the find example
        "sub-02/anat/sub-02_T1w.nii.gz": r.bytes(2000),
        "sub-03/anat/sub-03_T1w.nii.gz": r.bytes(3000),
        "sub-01/func/bold.json": b"{}\n",
        "data/sub-01/T1w.nii.gz": r.bytes(5000),
        "big.h5": r.bytes(1 << 20),
        "README": b"A dataset for the documentation's examples.\n",
        "labels.csv": b"file,label\na.jpg,cat\n",
        "participants.tsv": b"participant_id\tage\nsub-01\t31\nsub-02\t47\n",
        "participants.csv": b"participant_id,age\nsub-01,31\nsub-02,47\n",
    }
    write_tree(src, files)
    os.symlink("sub-01/anat/T1w.json", src / "latest")
    (src / "climate").mkdir()
    ds = xr.Dataset({"t2m": (("time",), np.arange(5.0))}, coords={"time": np.arange(5)})
    ds.to_netcdf(src / "climate/t2m.nc", engine="h5netcdf")
    g = zarr.open_group(str(src / "store.zarr"), mode="w", zarr_format=3)
    g.create_array("a", shape=(4, 3), dtype="int32")[:] = np.arange(12, dtype="int32").reshape(4, 3)
    (src / "tables").mkdir()
    pd.DataFrame({"a": [1, 2, 3]}).to_parquet(src / "tables/a.parquet", engine="pyarrow")
    # Real JPEGs for the training loop, made by the Pillow of its venv.
    py = venvs.get(SNIPPETS[("python.md", "import io, numpy as np, sheaf")]["reqs"])
    r2 = subprocess.run([py, "-c", JPEGS, src], capture_output=True, text=True)
    assert r2.returncode == 0, r2.stderr
    img = build(src, d / "dataset.sheaf")
    for name in ("hcp.sheaf", "stack.sheaf"):
        shutil.copy(img, d / name)
    # stack.sheaf signed by ops@site.org, who allowed_signers trusts.
    key = d / "ops_key"
    run("ssh-keygen", "-q", "-N", "", "-C", "ops", "-f", key, "-t", "ed25519")
    pub = " ".join((d / "ops_key.pub").read_text().split()[:2])
    (d / "allowed_signers").write_text(f"ops@site.org {pub}\n")
    run(sheaf_bin(), "sign", d / "stack.sheaf", "-k", key)
    www = d / "www"
    www.mkdir()
    for name in ("hcp.sheaf", "imagenet.sheaf"):
        shutil.copy(img, www / name)
    nginx = Nginx(d, www)
    yield {"dir": d, "src": src, "files": files, "nginx": nginx, "img": img}
    nginx.stop()


@pytest.fixture(scope="module")
def s3(world, seaweed):
    """The image as s3://bucket/ds.sheaf in a real SeaweedFS store (the
    name the docs use), and the AWS_* variables that reach it."""
    seaweed.make_bucket("bucket")
    seaweed.put_file("bucket", "ds.sheaf", world["img"])
    return {"url": "s3://bucket/ds.sheaf", "env": seaweed.env()}


def run_snippet(world, py, code: str, env_extra=None) -> subprocess.CompletedProcess:
    d = world["dir"]
    script = d / "snippet.py"
    script.write_text(code)
    env = {
        "PATH": f"{Path(py).parent}:/usr/bin:/bin",
        "HOME": str(d),
        "SHEAF_CONFIG": os.environ["SHEAF_CONFIG"],
        "SHEAF_CACHE_DIR": str(d / "cache"),
        **(env_extra or {}),
    }
    return subprocess.run([py, str(script)], capture_output=True, text=True, env=env, cwd=d, timeout=600)


def substitute(world, code: str) -> str:
    url = world["nginx"].url
    for a, b in (
        ("https://host/hcp.sheaf", url("hcp.sheaf")),
        ("https://data.example.org/imagenet.sheaf", url("imagenet.sheaf")),
        ("/etc/sheaf/allowed_signers", "allowed_signers"),
        ("s3://bucket/ds.sheaf", world.get("s3_url", "s3://bucket/ds.sheaf")),
    ):
        code = code.replace(a, b)
    return code


# The checks after each snippet, in the snippet's own names.
CHECKS = {
    "check_api": """
assert img.closed  # the block ends with img.close()
img = sheaf.open("dataset.sheaf")
files = json.load(open("files.json"))
blob = lambda p: bytes.fromhex(files[p])
assert header == blob("sub-01/anat/T1w.nii.gz")[352:452]
assert blobs == [blob(p) for p in paths]
assert text == blob("README").decode()
assert img.read_bytes("labels.csv") == blob("labels.csv")
assert img.stat("latest", follow_symlinks=False).target == "sub-01/anat/T1w.json"
assert img.find("sub-01", "-name", "*.nii.gz", "-size", "+10M") == ["sub-01/anat/T1w.nii.gz"]
assert sorted(img.find(name="*.json", type="f")) == sorted(p for p in files if p.endswith(".json"))
assert raw.readinto(bytearray(10)) == 10
""",
    "check_policy": "",
    "check_fsspec": """
assert fs.glob("sub-*/anat/*_T1w.nii.gz") == ["sub-02/anat/sub-02_T1w.nii.gz", "sub-03/anat/sub-03_T1w.nii.gz"]
assert pd.read_csv("sheaf://participants.tsv", sep="\\t", storage_options={"fo": "hcp.sheaf"})["age"].tolist() == [31, 47]
assert xr.open_dataset(fs.open("climate/t2m.nc"), engine="h5netcdf")["t2m"].values.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
assert zarr.open_group(fs.get_mapper("store.zarr"), mode="r")["a"][:].tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
""",
    "check_training": """
assert len(ds) == 12 and ds.classes == ["cat", "dog", "emu"]
assert len(batch) == 12 and {label for _, label in batch} == {0, 1, 2}
pixels, label = ds[0]
assert pixels.shape == (6, 8, 3) and label == 0 and abs(int(pixels[0, 0, 0]) - 200) < 10
""",
    "check_readme": """
files = json.load(open("files.json"))
assert sorted(img.find("train", name="*.jpg")) == sorted(p for p in files if p.startswith("train/"))
assert [len(b) for b in blobs] == [len(bytes.fromhex(files[p])) for p in img.find("train", name="*.jpg")]
""",
}


@pytest.mark.parametrize("key", list(SNIPPETS), ids=lambda k: f"{k[0]}:{k[1][:40]}")
def test_the_snippet_runs_in_a_clean_venv(key, world, venvs, s3):
    spec = SNIPPETS[key]
    (f, first, code) = next(b for b in all_blocks() if b[:2] == key)
    # The files the image holds, for the checks (hex, as JSON carries it).
    files = {
        str(p.relative_to(world["src"])): p.read_bytes().hex()
        for p in world["src"].rglob("*")
        if p.is_file() and not p.is_symlink()
    }
    (world["dir"] / "files.json").write_text(json.dumps(files))
    world["s3_url"] = s3["url"]
    prelude = "import json\n" + spec.get("prelude", "")
    if spec["check"] == "check_api":
        prelude += 'paths = ["README", "labels.csv", "sub-01/anat/T1w.json"]\n'
    body = literal_asserts(substitute(world, code))
    py = venvs.get(spec["reqs"])
    r = run_snippet(world, py, prelude + body + CHECKS[spec["check"]], env_extra=s3["env"])
    assert r.returncode == 0, f"{f}: the block beginning {first!r} failed:\n{body}\n{r.stderr}"
    if spec["check"] == "check_policy":
        # The comment's promise: PermissionError without a trusted signature.
        unsigned = prelude + body.replace('"stack.sheaf"', '"dataset.sheaf"')
        r = run_snippet(world, py, unsigned)
        assert r.returncode != 0 and "PermissionError" in r.stderr, r.stderr


def test_a_chained_https_url_needs_neither_aiohttp_nor_requests(world, venvs, sshd, s3):
    """Issue 54: `pd.read_csv("sheaf://participants.csv::https://...")`
    raised `ImportError: HTTPFileSystem requires "requests" and "aiohttp"`
    in a fresh venv, fsspec resolving the https link before sheaf is asked.
    With the wheel, fsspec and pandas alone, chained http(s)://, ssh:// and
    s3:// images read; fsspec's own filesystems still say what they need."""
    py = venvs.get(["fsspec", "pandas"])
    url = world["nginx"].url("hcp.sheaf")
    ssh = f"ssh://{sshd.user}@127.0.0.1{world['img']}"
    code = f"""
import fsspec, pandas as pd
from fsspec.core import _un_chain
df = pd.read_csv("sheaf://participants.csv::{url}")
assert df["age"].tolist() == [31, 47], df
with fsspec.open("sheaf://sub-01/anat/T1w.json::{url}") as f:
    assert f.read() == b'{{"RepetitionTime": 2.3}}\\n'
# https:// links parse as fsspec's own class parses them (no TLS server
# here: the https image itself is read by sheaf's reader, as http's is).
chain = _un_chain("sheaf://a/b.csv::https://host.example/x.sheaf", {{}})
assert [c[:2] for c in chain] == [("a/b.csv", "sheaf"), ("https://host.example/x.sheaf", "https")], chain
# Over ssh:// (sheaf's own SFTP through OpenSSH; no paramiko) and s3://
# (sheaf's own S3 client; no s3fs).
df = pd.read_csv("sheaf://participants.tsv::{ssh}", sep="\\t")
assert df["age"].tolist() == [31, 47], df
df = pd.read_csv("sheaf://participants.csv::s3://bucket/ds.sheaf")
assert df["age"].tolist() == [31, 47], df
# fsspec's own filesystems still need what they need, and say so.
for proto, words in (("https", "aiohttp"), ("http", "aiohttp"), ("sftp", "paramiko"), ("ssh", "paramiko"), ("s3", "s3fs")):
    try:
        fsspec.filesystem(proto)
    except ImportError as e:
        assert words in str(e), e
    else:
        raise AssertionError(proto + " made a filesystem without its dependencies")
print("ok")
"""
    env = {"SHEAF_SSH": sshd.ssh_command(), **s3["env"]}
    r = run_snippet(world, py, code, env_extra=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_with_fsspecs_own_dependencies_nothing_changes():
    """Where aiohttp and paramiko are installed (this venv), fsspec gets its
    very own classes for http(s), ssh and sftp through sheaf's entry
    points: sheaf changes nothing for other fsspec users."""
    import fsspec
    from fsspec.implementations.http import HTTPFileSystem
    from fsspec.implementations.sftp import SFTPFileSystem

    for proto in ("http", "https"):
        assert fsspec.get_filesystem_class(proto) is HTTPFileSystem
    for proto in ("ssh", "sftp"):
        assert fsspec.get_filesystem_class(proto) is SFTPFileSystem
    assert sys.modules["sheaf._links"].HTTPFileSystem is HTTPFileSystem
