#!/usr/bin/env python3
"""Write an HCP-like tar stream of N entries to stdout, generated on the fly.

The Human Connectome Project release is 15.7M files: about 1,100 subjects,
each a deep tree of a few thousand directories holding many small files.
This makes the same shape: subjects, each with fixed top directories, then
session directories of ~48 files; file sizes 12 B..1 KiB (the scale bench is
about entries, not bytes), contents deterministic text. Entry count
includes directories. Same N → same bytes (ustar, mtime fixed).

Usage: gen-tar.py N > tree.tar
"""
import sys

N = int(sys.argv[1])
MTIME = 1_600_000_000
FILES_PER_DIR = 48
TOPS = (b"MNINonLinear/Results", b"T1w/Diffusion", b"unprocessed/3T", b"release-notes")
out = sys.stdout.buffer
written = 0


def header(name: bytes, size: int, typeflag: bytes, mode: int) -> bytes:
    prefix = b""
    if len(name) > 100:  # ustar: split at a '/' into prefix (155) and name (100)
        cut = name.rindex(b"/", 0, 156)
        prefix, name = name[:cut], name[cut + 1:]
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"%07o\0" % mode
    h[108:116] = b"0001750\0"  # uid 1000
    h[116:124] = b"0001750\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"%011o\0" % MTIME
    h[148:156] = b"        "
    h[156:157] = typeflag
    h[257:265] = b"ustar\x0000"
    h[265:269] = b"hcp\0"
    h[297:301] = b"hcp\0"
    h[345:345 + len(prefix)] = prefix
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def emit(b: bytes) -> None:
    out.write(b)


def add_dir(path: bytes) -> bool:
    global written
    if written >= N:
        return False
    emit(header(path + b"/", 0, b"5", 0o755))
    written += 1
    return True


LINE = b"".join(b"%04d 0.%08d\n" % (i, (i * 2654435761) % 10**8) for i in range(160))


def add_file(path: bytes, k: int) -> bool:
    global written
    if written >= N:
        return False
    # Sizes 12..1035 bytes; every file different (its number leads), so
    # dedup cannot shortcut the build.
    body = b"%011d\n" % k + LINE[: (k * 40503) % 1024]
    size = len(body)
    emit(header(path, size, b"0", 0o644))
    emit(body)
    if size % 512:
        emit(b"\0" * (512 - size % 512))
    written += 1
    return True


def main() -> None:
    k = 0
    subject = 100000
    add_dir(b"hcp")
    while written < N:
        s = b"hcp/%d" % subject
        add_dir(s)
        for top in TOPS:
            parts = top.split(b"/")
            for i in range(1, len(parts) + 1):
                add_dir(s + b"/" + b"/".join(parts[:i]))
            # Sessions under each top: 75 directories of 48 files → ~14.5K
            # entries per subject, as in the release.
            for sess in range(75):
                d = s + b"/" + top + b"/session_%02d" % sess
                if not add_dir(d):
                    break
                for f in range(FILES_PER_DIR):
                    k += 1
                    if not add_file(d + b"/f%03d_%s.txt" % (f, b"abcdefgh"[f % 8:f % 8 + 3]), k):
                        break
            if written >= N:
                break
        subject += 1
    emit(b"\0" * 1024)
    out.flush()


main()
