"""The package behaves as the Python tools it sits beside (issue 54, section
4): a file that is no sheaf image is told apart from a damaged image; an
image closes (``close()``, ``with``) as files do; ``stat`` gives what
``os.stat`` gives; one path convention; a namespace without leaks."""

from __future__ import annotations

import errno
import io
import os
import shutil
import stat
import struct
import tarfile

import pytest

import sheaf
from conftest import build, run, sheaf_bin, write_tree


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    d = tmp_path_factory.mktemp("pythonic")
    src = write_tree(
        d / "src",
        {
            "sub-01/anat/T1w.json": b'{"x": 1}\n',
            "sub-01/anat/T1w.nii.gz": os.urandom(3000),
            "sub-01/func/bold.nii.gz": os.urandom(700),
            "top.txt": b"top\n",
        },
    )
    os.symlink("sub-01/anat/T1w.json", src / "latest")
    os.link(src / "top.txt", src / "hard.txt")
    os.chmod(src / "sub-01/func/bold.nii.gz", 0o640)
    os.utime(src / "top.txt", ns=(1_600_000_000_123_456_789, 1_700_000_000_987_654_321))
    img = build(src, d / "t.sheaf")
    return src, img


# --- not a sheaf image ----------------------------------------------------


def squashfs_superblock() -> bytes:
    """The first 4 KiB of a SquashFS 4.0 image (its 96-byte superblock as
    squashfs-tools writes it: magic 'hsqs', then counts, block size 128K,
    gzip, version 4.0), which is what a reader meets first."""
    sb = struct.pack(
        "<IIIIIHHHHHHQQQQQQQQ",
        0x73717368,  # s_magic "hsqs"
        3,  # inodes
        1_700_000_000,  # mkfs_time
        131072,  # block_size
        0,  # fragments
        1,  # compression: gzip
        17,  # block_log
        0,  # flags
        1,  # no_ids
        4,  # s_major
        0,  # s_minor
        0x60,  # root_inode
        4096,  # bytes_used
        0x200,  # id_table_start
        0xFFFFFFFFFFFFFFFF,  # xattr_id_table_start
        0x100,  # inode_table_start
        0x180,  # directory_table_start
        0x1C0,  # fragment_table_start
        0x1E0,  # lookup_table_start
    )
    assert len(sb) == 96 and sb[:4] == b"hsqs"
    return sb + bytes(4096 - len(sb))


def test_a_file_that_is_no_image_raises_not_an_image(tree, tmp_path):
    _, img = tree
    text = tmp_path / "notes.txt"
    text.write_text("just some text, not an image\n" * 20)
    sqfs = tmp_path / "data.sqfs"
    sqfs.write_bytes(squashfs_superblock())
    tarball = tmp_path / "ds.tar"
    with tarfile.open(tarball, "w") as t:
        t.add(img, arcname="t.sheaf")
    for p, says in ((text, "not a sheaf image"), (sqfs, "SquashFS"), (tarball, f"sheaf build {tarball}")):
        with pytest.raises(sheaf.NotAnImageError) as e:
            sheaf.open(p)
        assert says in str(e.value), str(e.value)  # what it is, and the command meant
        assert not isinstance(e.value, sheaf.IntegrityError), p
        assert isinstance(e.value, OSError) and e.value.errno == errno.EINVAL
        assert str(p) in str(e.value) and "not a sheaf image" in str(e.value), str(e.value)
        assert "\n" not in str(e.value)
    assert issubclass(sheaf.NotAnImageError, OSError)
    assert not issubclass(sheaf.NotAnImageError, sheaf.IntegrityError)


def test_a_damaged_image_is_still_an_integrity_error(tree, tmp_path):
    """Bytes that begin as an image's but end short are corruption."""
    _, img = tree
    cut = tmp_path / "cut.sheaf"
    data = img.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(sheaf.IntegrityError):
        sheaf.open(cut)


def test_a_directory_raises_is_a_directory(tree):
    src, _ = tree
    with pytest.raises(IsADirectoryError) as e:
        sheaf.open(src)
    assert e.value.errno == errno.EISDIR


def test_a_page_that_is_no_image_over_http_raises_not_an_image(nginx):
    (nginx.www / "index.html").write_text("<html><body>hello</body></html>\n" * 10)
    with pytest.raises(sheaf.NotAnImageError):
        sheaf.open(nginx.url("index.html"), cache=False)


# --- close and the context manager -----------------------------------------


def test_close_and_with_end_the_image_as_files_end(tree):
    _, img = tree
    with sheaf.open(img) as im:
        assert not im.closed
        assert im.listdir("") == ["hard.txt", "latest", "sub-01", "top.txt"]
        f = im.open("top.txt")
    assert im.closed
    for op in (
        lambda: im.listdir(""),
        lambda: im.stat("top.txt"),
        lambda: im.open("top.txt"),
        lambda: im.read_many(["top.txt"]),
        lambda: im.read_bytes("top.txt"),
        lambda: im.find(""),
        lambda: im.find_text(""),
        lambda: list(im.walk()),
        lambda: im.info(),
        lambda: im.exists("top.txt"),
    ):
        with pytest.raises(ValueError, match="closed image"):
            op()
    # As a ZipFile's members: a file opened before stays readable.
    assert f.read() == b"top\n"
    f.close()
    im.close()  # twice is allowed, as for files
    assert "closed" in repr(im) and im.root and im.source == str(img)
    with pytest.raises(ValueError):
        with im:
            pass
    im2 = sheaf.open(img)
    im2.close()
    with pytest.raises(ValueError):
        im2.listdir("")


# --- stat -----------------------------------------------------------------


def test_stat_is_an_os_stat_result_alike(tree):
    src, img = tree
    im = sheaf.open(img)
    for rel in ("", "sub-01", "top.txt", "hard.txt", "sub-01/func/bold.nii.gz", "latest"):
        for follow in (True, False):
            got = im.stat(rel, follow_symlinks=follow)
            want = os.stat(src / rel, follow_symlinks=follow)
            for f in ("st_mode", "st_size", "st_nlink", "st_uid", "st_gid", "st_mtime_ns", "st_mtime"):
                if f == "st_size" and stat.S_ISDIR(want.st_mode):
                    continue  # a directory's size is its filesystem's
                assert getattr(got, f) == getattr(want, f), (rel, follow, f)
            assert got.st_atime == got.st_ctime == got.st_mtime  # one time kept
            assert got.st_atime_ns == got.st_ctime_ns == got.st_mtime_ns
            assert got.st_blocks == (got.st_size + 511) // 512
            assert got.st_blksize == 4096 and got.st_dev == 0 and got.st_rdev == 0
            assert isinstance(got.st_ino, int)
            assert stat.S_IFMT(got.st_mode) == stat.S_IFMT(want.st_mode)
            assert stat.filemode(got.st_mode) == stat.filemode(want.st_mode)
    assert stat.S_ISDIR(im.stat("sub-01").st_mode)
    assert stat.S_ISREG(im.stat("latest").st_mode)
    assert stat.S_ISLNK(im.lstat("latest").st_mode)
    assert im.lstat("latest").target == "sub-01/anat/T1w.json" == os.readlink(src / "latest")
    assert im.stat("top.txt").target is None
    assert im.stat("top.txt").type == "file" and im.stat("").type == "directory"
    assert im.lstat("latest").type == "symlink" and im.stat("top.txt").layer == 0
    # Hard links share their inode, as os.stat shows.
    assert im.stat("hard.txt").st_ino == im.stat("top.txt").st_ino
    assert im.stat("top.txt").st_mtime_ns == 1_700_000_000_987_654_321
    st = im.stat("top.txt")
    with pytest.raises(AttributeError):
        st.st_size = 3  # read-only, as os.stat_result's
    assert "st_size=4" in repr(st)
    # scandir gives the same objects.
    entries = dict(im.scandir("sub-01/anat"))
    assert entries["T1w.json"].st_size == 9
    assert stat.S_ISREG(entries["T1w.nii.gz"].st_mode)


def test_a_device_node_stats_with_its_numbers(tmp_path):
    """As root: a character device keeps its major and minor (st_rdev)."""
    assert os.geteuid() == 0, "needs root to make a device node"
    src = tmp_path / "dev"
    src.mkdir()
    os.mknod(src / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    im = sheaf.open(build(src, tmp_path / "dev.sheaf"))
    st = im.lstat("null")
    assert stat.S_ISCHR(st.st_mode) and st.type == "char-device"
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    assert st.st_size == 0


# --- one path convention ---------------------------------------------------


def test_one_path_convention(tree):
    """Paths in: relative to the image's root, a leading or trailing '/'
    ignored, '' or '/' the root. Paths out (find, files, walk, find_text):
    relative to the root, no leading '/', as find() and walk() give them."""
    src, img = tree
    im = sheaf.open(img)
    for a, b in (("sub-01", "/sub-01/"), ("", "/"), ("sub-01/anat", "/sub-01/anat")):
        assert im.listdir(a) == im.listdir(b)
        assert im.find(a) == im.find(b)
        assert im.find_text(a) == im.find_text(b)
        assert [d for d, _, _ in im.walk(a)] == [d for d, _, _ in im.walk(b)]
        assert im.stat(a).st_ino == im.stat(b).st_ino
    want = sorted(
        os.path.relpath(os.path.join(d, n), src)
        for d, ds, fs in os.walk(src)
        for n in ds + fs
    )
    assert sorted(im.find("")) == [""] + want  # the root is '', as walk() gives it
    assert sorted(im.find("/", "-mindepth", "1")) == want
    # find_text prints the paths find returns, as find(1) run at the
    # image's root prints them (the root as '.').
    lines = im.find_text("", "-mindepth", "1", "-print").splitlines()
    assert sorted(lines) == ["./" + p for p in want]
    assert im.find_text("sub-01", "-print").splitlines() == ["sub-01"] + im.find("sub-01", "-mindepth", "1")
    assert im.find_text("sub-01", "-type", "f", "-printf", "%p %s\n").splitlines() == [
        f"{p} {os.path.getsize(src / p)}" for p in im.find("sub-01", type="f")
    ]
    assert im.find_text("", "-maxdepth", "0", "-print") == ".\n"
    assert [d for d, _, _ in im.walk("")] == sorted(
        {""} | {os.path.relpath(d, src) for d, _, _ in os.walk(src) if d != str(src)}
    )
    assert im.files("sub-01") == sorted(im.find("sub-01", type="f"))
    # The command takes an absolute start and prints as given: the
    # relative form's text is the same after the leading '/'.
    cli = run(sheaf_bin(), "find", img, "/sub-01", "-printf", "%p %m\n").stdout
    assert im.find_text("sub-01", "-printf", "%p %m\n") == cli.replace("/sub-01", "sub-01")


# --- the namespace ----------------------------------------------------------


def test_the_public_namespace_is_all_and_only_all():
    public = {n for n in dir(sheaf) if not n.startswith("_")}
    # Submodules appear once imported (sheaf.fsspec by fsspec's entry point).
    public -= {"fsspec"}
    assert public == set(sheaf.__all__) - {"__version__"}
    for leak in ("Any", "Dict", "List", "Optional", "os", "json", "io", "posixpath", "TypedDict", "PathLike"):
        assert leak not in dir(sheaf), leak
    for n in sheaf.__all__:
        assert hasattr(sheaf, n), n
    assert sheaf.Stat.__module__ == "sheaf"


def test_stat_results_pickle_and_compare_as_os_stat_results_do(tree):
    """A data loader's workers send stat results between processes."""
    import pickle

    _, img = tree
    im = sheaf.open(img)
    for p in ("", "top.txt", "latest", "sub-01/func/bold.nii.gz"):
        st = im.lstat(p)
        for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):
            back = pickle.loads(pickle.dumps(st, proto))
            assert back == st and back is not st
            for f in ("st_mode", "st_ino", "st_size", "st_blocks", "st_mtime_ns", "st_mtime", "type", "target", "layer"):
                assert getattr(back, f) == getattr(st, f), (p, f)
    assert im.stat("top.txt") == im.stat("top.txt") != im.stat("latest")
    assert im.stat("top.txt") != im.stat("sub-01")
    with pytest.raises(ValueError):
        sheaf.Stat(0o100644, 1, 1, 0, 0, 3, 0, 0, "weird")
