"""The API on real images built by the real `sheaf` command."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading

import pytest

import sheaf
from conftest import ROOT, build, run, sheaf_bin, write_tree


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """10,000 small files of varied sizes in 100 directories, some large
    files, a symlink, an empty file."""
    import random

    r = random.Random(7)
    d = tmp_path_factory.mktemp("many")
    src = d / "src"
    files = {}
    for i in range(10_000):
        n = r.choice([0, 1, 17, 300, 4096, 5000, 70_000]) if i % 97 else r.randrange(200_000)
        files[f"d{i % 100:03d}/f{i:05d}.bin"] = r.randbytes(n)
    files["big/random.bin"] = r.randbytes(5 * (1 << 20) + 123)
    files["big/text.txt"] = b"".join(b"line %d of a text that compresses\n" % i for i in range(200_000))
    write_tree(src, files)
    os.symlink("big/text.txt", src / "link")
    os.symlink("../big", src / "d000" / "dirlink")
    img = build(src, d / "many.sheaf")
    return src, img, files


def test_read_many_returns_exactly_each_files_bytes(many):
    src, img, files = many
    im = sheaf.open(img)
    paths = sorted(p for p in files if p.startswith("d"))
    assert len(paths) == 10_000
    got = im.read_many(paths, threads=4)
    assert len(got) == len(paths)
    for p, b in zip(paths, got):
        assert b == files[p], p
    # Default threads, and the same list again (cached blocks).
    assert im.read_many(paths[::7]) == [files[p] for p in paths[::7]]


def test_read_many_releases_the_gil(many):
    """Another Python thread runs while read_many works."""
    _, img, files = many
    im = sheaf.open(img)
    paths = sorted(files)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        for _ in range(3):
            im.read_many(paths, threads=2)
    finally:
        stop.set()
        t.join()
    assert len(ticks) > 5


def test_seek_and_read_at_random_offsets_equal_the_source(many, rng):
    _, img, files = many
    im = sheaf.open(img)
    for name in ("big/random.bin", "big/text.txt", "d001/f00001.bin"):
        want = files[name]
        with im.open(name) as f:
            assert isinstance(f, io.BufferedReader)
            assert f.seekable() and f.readable()
            assert f.read() == want
            for _ in range(300):
                off = rng.randrange(len(want) + 10) if want else 0
                n = rng.choice([0, 1, 7, 4096, 65536, 1 << 20])
                assert f.seek(off) == off
                assert f.read(n) == want[off : off + n]
                assert f.tell() == min(off + len(want[off : off + n]), max(off, len(want)))
            k = min(10, len(want))
            f.seek(-k, io.SEEK_END)
            assert f.read() == want[len(want) - k :]
            with pytest.raises(OSError):
                f.seek(-len(want) - 1, io.SEEK_END)
        raw = im.open(name, buffering=0)
        assert isinstance(raw, io.RawIOBase)
        buf = bytearray(1000)
        raw.seek(3)
        n = raw.readinto(buf)
        assert bytes(buf[:n]) == want[3 : 3 + 1000]
        # BufferedReader over the raw file, as any library builds it.
        b = io.BufferedReader(raw, 8192)
        b.seek(0)
        assert b.read() == want
        raw.close()
        with pytest.raises(ValueError):
            raw.read(1)


def test_text_mode_and_symlinks(many):
    _, img, files = many
    im = sheaf.open(img)
    with im.open("link", "r") as f:
        assert f.readline() == "line 0 of a text that compresses\n"
    assert im.readlink("link") == "big/text.txt"
    assert im.stat("link", follow_symlinks=False).type == "symlink"
    assert im.stat("link").st_size == len(files["big/text.txt"])
    assert "random.bin" in im.listdir("d000/dirlink")


def test_stat_listdir_walk_match_the_tree(many):
    src, img, files = many
    im = sheaf.open(img)
    assert im.listdir("") == sorted(os.listdir(src))
    assert im.listdir("/d005/") == sorted(os.listdir(src / "d005"))
    st = im.stat("big/random.bin")
    os_st = os.stat(src / "big/random.bin")
    assert st.type == "file" and st.st_size == os_st.st_size
    assert st.st_mode & 0o7777 == os_st.st_mode & 0o7777
    assert st.st_mtime_ns == os_st.st_mtime_ns
    assert im.stat("").type == "directory"
    walked = set()
    for d, dirs, fs in im.walk():
        for f in fs:
            walked.add(f"{d}/{f}" if d else f)
    want = set()
    for d, dirs, fs in os.walk(src):
        for f in fs + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            want.add(os.path.relpath(os.path.join(d, f), src))
    assert walked == want
    assert len(im.files()) == len(files)


def test_find_is_the_engine_of_sheaf_find(many):
    src, img, files = many
    im = sheaf.open(img)
    assert im.find("big", name="*.bin", type="f") == ["big/random.bin"]
    assert im.find("", "-name", "f0000[0-3].bin") == ["d000/f00000.bin", "d001/f00001.bin", "d002/f00002.bin", "d003/f00003.bin"]
    # find(1)'s operators and -prune; paths relative to the root.
    got = im.find("", "-name", "d0[1-9]*", "-prune", "-o", "-type", "f", "-size", "+100k", "-print")
    assert "big/random.bin" in got and not any(p.startswith(("d01", "d02")) for p in got)
    assert set(im.find("", "-type", "l")) == {"link", "d000/dirlink"}
    # -printf: the same output as the command's.
    expr = ["-type", "f", "-size", "+1M", "-printf", "%s %p %m %y\\n"]
    cli = run(sheaf_bin(), "find", img, "/big", *expr).stdout
    assert im.find_text("/big", *expr) == cli.replace(" /big/", " big/")  # paths from the root
    with pytest.raises(ValueError) as e:
        im.find("", "-bogus")
    assert "-bogus" in str(e.value)
    with pytest.raises(ValueError):
        im.find("", "-printf", "%p")
    with pytest.raises(FileNotFoundError):
        im.find("no/such/dir")


def test_info_has_the_fields_of_sheaf_info_json(many):
    _, img, _ = many
    im = sheaf.open(img)
    cli = json.loads(run(sheaf_bin(), "info", "--json", img).stdout)
    assert im.info() == cli
    assert set(cli) == set(sheaf.Info.__annotations__)
    assert im.root == cli["root_digest"]
    assert im.root == run(sheaf_bin(), "root", img).stdout.split("blake3:")[-1].strip()


def test_errors_are_the_exceptions_python_code_expects(many, tmp_path):
    _, img, _ = many
    im = sheaf.open(img)
    with pytest.raises(FileNotFoundError) as e:
        im.open("no/such/file")
    assert str(e.value) == "no/such/file: no such file or directory in the image"
    assert e.value.errno == 2
    with pytest.raises(IsADirectoryError) as e:
        im.open("d000")
    assert "d000: is a directory" == str(e.value)
    with pytest.raises(IsADirectoryError):
        im.read_many(["d001/f00001.bin", "big"])
    with pytest.raises(NotADirectoryError):
        im.listdir("big/random.bin")
    with pytest.raises(FileNotFoundError):
        im.read_many(["d001/f00001.bin", "nothing"])
    with pytest.raises(FileNotFoundError) as e:
        sheaf.open(tmp_path / "absent.sheaf")
    assert "absent.sheaf" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError):
        im.open("big/text.txt", "w")
    with pytest.raises(ValueError):
        im.read_many(["link"], threads=0)
    assert issubclass(sheaf.IntegrityError, OSError)


def test_a_stack_of_layers_is_one_tree(tmp_path):
    a = write_tree(tmp_path / "a", {"x/keep.txt": b"base\n", "x/gone.txt": b"old\n", "y.txt": b"base y\n"})
    b = write_tree(tmp_path / "b", {"x/new.txt": b"new\n", "y.txt": b"top y\n", "x/.wh.gone.txt": b""})
    ia, ib = build(a, tmp_path / "a.sheaf"), build(b, tmp_path / "b.sheaf")
    im = sheaf.open(f"{ia},{ib}")
    assert im.listdir("x") == ["keep.txt", "new.txt"]
    assert im.read_many(["y.txt", "x/keep.txt", "x/new.txt"]) == [b"top y\n", b"base\n", b"new\n"]
    with im.open("y.txt") as f:
        assert f.read() == b"top y\n"
    with pytest.raises(FileNotFoundError):
        im.stat("x/gone.txt")
    assert len(im.root.split(",")) == 2
    assert [i["image"] for i in im.info()] == [str(ia), str(ib)]


def test_the_package_imports_and_reads_without_the_cli(many):
    """No `sheaf` on PATH and no hint where the build is: the package
    needs nothing but itself."""
    _, img, files = many
    code = (
        "import shutil, sheaf, sys\n"
        "assert shutil.which('sheaf') is None and shutil.which('sheaf-full') is None\n"
        f"im = sheaf.open({str(img)!r})\n"
        "sys.stdout.write(str(len(im.read_bytes('big/text.txt'))))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SHEAF_BIN", "CARGO_TARGET_DIR")}
    env["PATH"] = os.path.dirname(sys.executable)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout == str(len(files["big/text.txt"]))
    # And it is the installed package, not a checkout on the path.
    r = subprocess.run([sys.executable, "-c", "import sheaf; print(sheaf.__file__)"], capture_output=True, text=True, env=env, cwd="/")
    assert not r.stdout.startswith(str(ROOT / "crates")), r.stdout
