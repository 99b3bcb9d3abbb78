"""Issue 53 (hostile input, round two), the Python package: read_many's
thread pools stay bounded, a large sparse read costs its size once, and
walk is linear in the depth of the tree."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import sheaf
from conftest import build, write_tree


def tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def test_read_many_with_many_thread_counts_keeps_one_pool(tmp_path):
    src = write_tree(tmp_path / "src", {f"f{i}": bytes([i]) * 100 for i in range(8)})
    img = sheaf.open(build(src, tmp_path / "t.sheaf"), cache=False)
    paths = [f"f{i}" for i in range(8)]
    want = [bytes([i]) * 100 for i in range(8)]
    before = tasks()
    for n in range(1, 65):
        assert img.read_many(paths, threads=n) == want
    # At most the largest pool asked for (64 threads) stands; the old ones
    # end once their last call returns (a moment, not never).
    bound = before + 64
    deadline = time.time() + 10
    while tasks() > bound and time.time() < deadline:
        time.sleep(0.05)
    assert tasks() <= bound, f"{tasks()} threads, {before} before 64 calls"


def rss_growth(img_path, how: str) -> tuple[int, int]:
    """(peak RSS growth in bytes, bytes read) of one read in a fresh process."""
    code = textwrap.dedent(
        f"""
        import resource, sheaf
        img = sheaf.open({str(img_path)!r}, cache=False)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        data = {how}
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert data.endswith(b"tail") and data.rstrip(b"tail\\0") == b"", "content"
        print((after - before) * 1024, len(data))
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    grew, n = r.stdout.split()
    return int(grew), int(n)


def test_a_large_sparse_read_costs_its_size_once(tmp_path):
    size = 2 << 30
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "big", "wb") as f:
        f.truncate(size - 4)
        f.seek(size - 4)
        f.write(b"tail")
    img = build(src, tmp_path / "s.sheaf")
    assert os.path.getsize(img) < 1 << 20
    for how in ('img.read_bytes("big")', 'img.open("big", buffering=0).read()'):
        grew, n = rss_growth(img, how)
        assert n == size
        # One buffer of the file's size (the bytes object), not two.
        assert grew <= size * 1.2, f"{how}: peak RSS grew {grew} for a read of {size}"


DEPTH = 4000  # sheaf build refuses more than 4096 levels


def make_deep(root, depth: int) -> None:
    """`depth` nested directories d/d/…/d with a file at the bottom, made
    by relative steps (the whole path is longer than PATH_MAX)."""
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as f:
            f.write(b"bottom")
    finally:
        os.close(fd)


def remove_deep(root, depth: int) -> None:
    """Undo make_deep without recursion."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    for _ in range(depth):
        fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
    os.unlink("leaf", dir_fd=fds[-1])
    for i in range(depth, 0, -1):
        os.close(fds[i])
        os.rmdir("d", dir_fd=fds[i - 1])
    os.close(fds[0])
    os.rmdir(root)


def test_walk_of_a_deep_tree_is_linear(tmp_path):
    src = tmp_path / "deep"
    make_deep(src, DEPTH)
    try:
        img = sheaf.open(build(src, tmp_path / "deep.sheaf"), cache=False)
    finally:
        remove_deep(src, DEPTH)
    t = time.monotonic()
    seen = list(img.walk())
    took = time.monotonic() - t
    assert len(seen) == DEPTH + 1
    assert seen[0] == ("", ["d"], [])
    bottom = "/".join(["d"] * DEPTH)
    assert seen[-1] == (bottom, [], ["leaf"])
    assert took < 2.0, f"walk of {DEPTH} levels took {took:.1f} s"
