"""Images over HTTP from a real nginx on loopback: h5py reads a hyperslab
fetching only the blocks that hold it (bytes counted by nginx), and the
node cache the CLI fills is not fetched again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import fsspec
import h5py
import numpy as np
import pandas as pd
import pytest

import sheaf
from conftest import build, sheaf_bin

SLAB = (slice(1024, 1536), slice(512, 1024))


@pytest.fixture(scope="module")
def h5(tmp_path_factory):
    d = tmp_path_factory.mktemp("h5")
    src = d / "src"
    src.mkdir()
    r = np.random.default_rng(5)
    # 64 MiB of values that do not compress: what is fetched is what is read.
    data = r.standard_normal((4096, 2048))
    with h5py.File(src / "data.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=(256, 256))
    (src / "small.csv").write_text("a,b\n1,2\n3,4\n")
    img = build(src, d / "h5.sheaf", "--block-size", "1M")
    return img, data


def test_h5py_reads_a_hyperslab_fetching_only_its_blocks(h5, nginx):
    img, data = h5
    shutil.copy(img, nginx.www / "h5.sheaf")
    im = sheaf.open(nginx.url("h5.sheaf"), cache=False)
    raw = im.open("data.h5", buffering=0)
    ranges = []
    orig = raw.readinto

    def readinto(b, orig=orig, raw=raw):
        at = raw.tell()
        n = orig(b)
        ranges.append((at, n))
        return n

    raw.readinto = readinto
    before = nginx.bytes_sent()
    with h5py.File(raw, "r") as f:
        got = f["x"][SLAB]
    np.testing.assert_array_equal(got, data[SLAB])
    fetched = nginx.bytes_sent() - before
    # The blocks holding what h5py read (its metadata and the slab's chunks).
    touched = {}
    for foff, n, block, _, stored in im.blocks("data.h5"):
        for at, m in ranges:
            if m and at < foff + n and foff < at + m:
                touched[block] = stored
    need = sum(touched.values())
    all_blocks = {b: s for _, _, b, _, s in im.blocks("data.h5")}
    print(f"fetched {fetched} B for blocks of {need} B ({len(touched)} of {len(all_blocks)} blocks)")
    assert fetched <= 1.2 * need, (fetched, need)
    # And the slab is a small part of the file: reading it did not fetch all.
    assert need < 0.25 * sum(all_blocks.values())
    assert all(status in (200, 206) for _, status, _ in nginx.requests())


def test_the_cli_cache_is_not_fetched_twice(h5, nginx, tmp_path):
    img, data = h5
    shutil.copy(img, nginx.www / "h5.sheaf")
    url = nginx.url("h5.sheaf")
    cache = tmp_path / "node-cache"
    # The CLI reads the file through the node cache.
    env = dict(os.environ, SHEAF_CACHE_DIR=str(cache))
    subprocess.run([sheaf_bin(), "cat", url, "data.h5"], env=env, check=True, stdout=subprocess.DEVNULL)
    after_cli = nginx.bytes_sent()
    assert after_cli > 60 << 20
    # Python opens the same image with the same cache: no block again.
    im = sheaf.open(url, cache=cache)
    with h5py.File(im.open("data.h5"), "r") as f:
        np.testing.assert_array_equal(f["x"][SLAB], data[SLAB])
    assert im.read_many(["data.h5"])[0] == (img.parent / "src/data.h5").read_bytes()
    again = nginx.bytes_sent() - after_cli
    assert again <= 128 << 10, f"{again} bytes fetched again"
    # The environment's cache is the CLI's too.
    os.environ["SHEAF_CACHE_DIR"] = str(cache)
    before = nginx.bytes_sent()
    sheaf.open(url).read_many(["data.h5"])
    assert nginx.bytes_sent() - before <= 128 << 10


def test_fsspec_chained_over_https_uses_sheafs_reader(h5, nginx):
    img, _ = h5
    shutil.copy(img, nginx.www / "h5.sheaf")
    url = nginx.url("h5.sheaf")
    df = pd.read_csv(f"sheaf://small.csv::{url}")
    assert df.to_dict("list") == {"a": [1, 3], "b": [2, 4]}
    # Range requests by sheaf (whole-image GETs would send 64 MiB).
    assert nginx.bytes_sent() < 1 << 20
    with fsspec.open(f"sheaf://data.h5::{url}") as f:
        with h5py.File(f, "r") as h:
            assert h["x"].shape == (4096, 2048)


def test_an_unreachable_server_falls_back_to_the_cached_index_with_a_warning(h5, nginx, tmp_path):
    img, data = h5
    shutil.copy(img, nginx.www / "h5.sheaf")
    url = nginx.url("h5.sheaf")
    cache = tmp_path / "cache"
    im = sheaf.open(url, cache=cache)
    assert im.read_many(["small.csv"]) == [b"a,b\n1,2\n3,4\n"]
    nginx.stop()
    with pytest.warns(sheaf.OfflineWarning, match="unreachable"):
        im = sheaf.open(url, cache=cache)
    assert im.read_many(["small.csv"]) == [b"a,b\n1,2\n3,4\n"]
    with pytest.raises(OSError) as e:
        im.read_many(["data.h5"])
    assert "offline" in str(e.value)


def test_a_missing_url_is_file_not_found(nginx):
    with pytest.raises(FileNotFoundError):
        sheaf.open(nginx.url("absent.sheaf"), cache=False)


SECRETS = ("s3cr3t", "deadbeef0123", "AKIASECRET", "t0kenvalue")


def secret_url(nginx, name):
    """`name` on nginx with a password and a presigned query (nginx ignores
    both: the secrets only travel)."""
    base = nginx.url(name)
    return (
        base.replace("http://", "http://alice:s3cr3t@", 1)
        + "?X-Amz-Signature=deadbeef0123&X-Amz-Credential=AKIASECRET&token=t0kenvalue"
    )


def test_credentials_are_never_shown_nor_stored(tmp_path, nginx):
    """Issue 53: repr, source, info() and the node cache's index hold the
    redacted URL only, private."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello\n")
    shutil.copy(build(src, tmp_path / "s.sheaf"), nginx.www / "s.sheaf")
    cache = tmp_path / "cache"
    url = secret_url(nginx, "s.sheaf")
    im = sheaf.open(url, cache=str(cache))
    assert im.read_bytes("a.txt") == b"hello\n"
    # Expected: what the redaction rule says, written out here.
    shown = (
        nginx.url("s.sheaf").replace("http://", "http://alice:***@", 1)
        + "?X-Amz-Signature=***&X-Amz-Credential=***&token=***"
    )
    assert im.source == shown
    assert shown in repr(im)
    assert im.info()["image"] == shown
    texts = [repr(im), im.source, json.dumps(im.info())]
    for f in sorted((cache / "index").iterdir()):
        texts.append(f.read_bytes().decode("latin-1"))
        assert f.stat().st_mode & 0o777 == 0o600, f
    assert (cache / "index").stat().st_mode & 0o777 == 0o700
    urls = [f.read_text() for f in (cache / "index").glob("*.url")]
    assert urls == [shown]
    for t in texts:
        for s in SECRETS:
            assert s not in t, (s, t)
    # A missing image: the error names the URL, redacted.
    with pytest.raises(Exception) as e:
        sheaf.open(secret_url(nginx, "missing.sheaf"), cache=False)
    for s in SECRETS:
        assert s not in str(e.value)

