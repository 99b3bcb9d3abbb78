"""Damaged and hostile images, and the signature policy."""

from __future__ import annotations

import os
import random
import shutil

import pytest

import sheaf
from conftest import build, run, sheaf_bin, write_tree

VICTIM = "a.bin"
INTACT = "dir/b.txt"


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    d = tmp_path_factory.mktemp("corrupt")
    r = random.Random(3)
    files = {
        VICTIM: r.randbytes(2 * (1 << 20) + 5000),
        INTACT: b"".join(b"%d text that compresses\n" % i for i in range(5000)),
        "dir/c.txt": b"small\n",
    }
    src = write_tree(d / "src", files)
    img = build(src, d / "good.sheaf", "--block-size", "1M")
    return d, img, files


def flipped(d, img, at: int, name: str):
    b = bytearray(img.read_bytes())
    b[at] ^= 0x5A
    out = d / name
    out.write_bytes(b)
    return out


def test_a_flipped_byte_in_a_data_block_raises_and_never_returns_wrong_bytes(good):
    d, img, files = good
    im = sheaf.open(img)
    blocks = im.blocks(VICTIM)
    assert len(blocks) > 1
    _, _, block, at, stored = blocks[0]
    assert INTACT not in [p for p in files if any(b[2] == block for b in im.blocks(p))]
    bad = sheaf.open(flipped(d, img, at + stored // 2, "flip-data.sheaf"))
    # Opening succeeds (metadata intact); reading the damaged block fails.
    with pytest.raises(sheaf.IntegrityError) as e:
        bad.read_many([VICTIM])
    assert "data block" in str(e.value) and "\n" not in str(e.value)
    assert e.value.errno == 5
    f = bad.open(VICTIM, buffering=0)
    with pytest.raises(sheaf.IntegrityError):
        f.read(100)
    with pytest.raises(sheaf.IntegrityError):
        bad.open(VICTIM).read()
    with pytest.raises(sheaf.IntegrityError):
        bad.read_many([INTACT, VICTIM], threads=2)
    # Bytes elsewhere in the file, in intact blocks, are still right, and
    # intact files read as they were.
    if len(blocks) > 1:
        off, n, *_ = blocks[-1]
        f.seek(off)
        assert f.read(n) == files[VICTIM][off : off + n]
    assert bad.read_many([INTACT, "dir/c.txt"]) == [files[INTACT], files["dir/c.txt"]]


@pytest.mark.parametrize(
    "damage",
    ["truncate-1", "truncate-half", "truncate-100", "empty", "random", "flip-tail", "flip-every-4k"],
)
def test_damaged_images_raise_integrity_errors_never_crash(good, damage):
    d, img, files = good
    b = bytearray(img.read_bytes())
    r = random.Random(damage)
    if damage == "truncate-1":
        b = b[:-1]
    elif damage == "truncate-half":
        b = b[: len(b) // 2]
    elif damage == "truncate-100":
        b = b[:100]
    elif damage == "empty":
        b = b""
    elif damage == "random":
        b = bytearray(r.randbytes(1 << 20))
    elif damage == "flip-tail":
        b[-200] ^= 0xFF
    elif damage == "flip-every-4k":
        for i in range(0, len(b), 4096):
            b[i] ^= 0x01
    p = d / f"{damage}.sheaf"
    p.write_bytes(bytes(b))
    try:
        im = sheaf.open(p)
    except (sheaf.IntegrityError, sheaf.NotAnImageError) as e:
        # Bytes that do not begin as an image's (random ones, a flipped
        # magic) are no image; the rest (an empty file too) is corruption.
        assert isinstance(e, sheaf.NotAnImageError) == (len(b) >= 8 and b[:8] != img.read_bytes()[:8]), e
        assert str(e) and "\n" not in str(e)
        return
    # Opened (the damage is in data or pages not read yet): every read
    # either fails as IntegrityError or returns the right bytes.
    for path, want in files.items():
        try:
            got = im.read_many([path])[0]
        except (sheaf.IntegrityError, FileNotFoundError, NotADirectoryError):
            continue
        assert got == want, path


def test_hostile_images_from_the_fuzz_corpus_never_crash(tmp_path):
    """Random bytes behind a valid header and trailer shape: whatever the
    reader finds, it raises an exception (no abort, no panic escaping)."""
    r = random.Random(11)
    src = write_tree(tmp_path / "s", {f"f{i}": r.randbytes(r.randrange(5000)) for i in range(50)})
    img = build(src, tmp_path / "s.sheaf")
    good = img.read_bytes()
    for i in range(150):
        b = bytearray(good)
        for _ in range(r.randrange(1, 20)):
            b[r.randrange(len(b))] = r.randrange(256)
        p = tmp_path / f"h{i}.sheaf"
        p.write_bytes(bytes(b))
        try:
            im = sheaf.open(p)
            for d, dirs, fs in im.walk():
                im.read_many([f"{d}/{x}" if d else x for x in fs])
            im.info()
        except (sheaf.IntegrityError, OSError):
            pass
        p.unlink()


def keygen(d, name="ed"):
    key = d / name
    run("ssh-keygen", "-q", "-N", "", "-C", name, "-f", key, "-t", "ed25519")
    pub = " ".join((d / f"{name}.pub").read_text().split()[:2])
    return key, pub


def test_an_unsigned_image_under_a_required_signature_policy_is_refused(good, tmp_path, isolated):
    assert shutil.which("ssh-keygen"), "ssh-keygen is needed (openssh-client)"
    _, img0, files = good
    img = tmp_path / "img.sheaf"
    shutil.copy(img0, img)
    key, pub = keygen(tmp_path)
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"alice@example.org {pub}\n")
    # The site requires signatures (the config file every command reads).
    isolated.write_text(f'[signatures]\nrequire = true\nsigners = "{allowed}"\n')
    with pytest.raises(PermissionError) as e:
        sheaf.open(img)
    assert "refused: no trusted signature" in str(e.value)
    assert str(img) in str(e.value) and "\n" not in str(e.value)
    # Signed with a trusted key: accepted.
    run(sheaf_bin(), "sign", img, "-k", key)
    im = sheaf.open(img)
    assert im.read_many([INTACT]) == [files[INTACT]]
    # Flags add to the site policy, never relax it.
    with pytest.raises(PermissionError):
        sheaf.open(img0, require_signature=False)
    # Without a site policy, the flag alone requires it.
    isolated.write_text("")
    assert sheaf.open(img0).root
    other_key, other_pub = keygen(tmp_path, "other")
    other = tmp_path / "other_signers"
    other.write_text(f"bob@example.org {other_pub}\n")
    with pytest.raises(PermissionError):
        sheaf.open(img0, require_signature=True, signers=allowed)
    with pytest.raises(PermissionError):
        sheaf.open(img, require_signature=True, signers=other)
    assert sheaf.open(img, require_signature=True, signers=allowed, identity="alice@example.org").root
    with pytest.raises(PermissionError):
        sheaf.open(img, require_signature=True, signers=allowed, identity="mallory@example.org")
    # Requiring with nobody trusted is refused, as the CLI refuses it.
    with pytest.raises(PermissionError):
        sheaf.open(img, require_signature=True)


def test_a_broken_site_config_is_one_clear_error(good, isolated):
    _, img, _ = good
    isolated.write_text("[signatures\n")
    with pytest.raises(OSError) as e:
        sheaf.open(img)
    assert "config.toml" in str(e.value) and "\n" not in str(e.value)
    os.environ["SHEAF_CONFIG"] = str(isolated) + ".absent"
    with pytest.raises(FileNotFoundError):
        sheaf.open(img)
