"""Images over SSH (a real sshd on loopback, the system's OpenSSH client)."""

from __future__ import annotations

import random

import fsspec
import pandas as pd

import sheaf
from conftest import build, write_tree


def test_an_image_over_ssh_reads_exactly_the_source(sshd, tmp_path):
    r = random.Random(9)
    files = {f"d{i % 7}/f{i}.bin": r.randbytes(r.randrange(40_000)) for i in range(300)}
    files["t/a.csv"] = b"x,y\n1,2\n"
    img = build(write_tree(tmp_path / "src", files), tmp_path / "s.sheaf", "--block-size", "64K")
    url = f"ssh://{sshd.user}@127.0.0.1{img}"
    im = sheaf.open(url, cache=False)
    paths = sorted(files)
    assert im.read_many(paths, threads=4) == [files[p] for p in paths]
    with im.open("d3/f3.bin") as f:
        f.seek(100)
        assert f.read(1000) == files["d3/f3.bin"][100:1100]
    assert im.root == sheaf.open(img).root
    # fsspec's sftp URL goes to sheaf's own ssh reader.
    fs = fsspec.filesystem("sheaf", fo=f"sftp://{sshd.user}@127.0.0.1{img}", skip_instance_cache=True)
    assert fs.image.source.startswith("ssh://")
    assert fs.cat_file("t/a.csv") == b"x,y\n1,2\n"
    df = pd.read_csv(f"sheaf://t/a.csv::ssh://{sshd.user}@127.0.0.1{img}")
    assert df.to_dict("list") == {"x": [1], "y": [2]}
