#!/usr/bin/env python3
"""Write a small OCI image layout for the container tests, independently of
sheaf: tar layers made here (whiteouts, an opaque directory, a hardlink, a
directory replaced by a file, a duplicate entry, a setcap binary, a device,
an empty layer), each stored gzip- and zstd-compressed, and a multi-platform
index. Digests and diffIDs are computed here with hashlib.

usage: mkoci.py OUT_LAYOUT BASE_ROOTFS_DIR [--hostile PATH]
Tags in OUT_LAYOUT/index.json:
  gz     amd64 image, gzip layers       zst   the same layers, zstd
  arm    an arm64 image (one more layer) multi an index of gz's manifest + arm
  extra  gz's layers plus one more (shares the base layers)
Prints a JSON summary (diffIDs, blob digests) on stdout.
"""
import gzip, hashlib, io, json, os, struct, subprocess, sys, tarfile

out, base = sys.argv[1], sys.argv[2]
hostile = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--hostile" else None
os.makedirs(f"{out}/blobs/sha256", exist_ok=True)
with open(f"{out}/oci-layout", "w") as f:
    json.dump({"imageLayoutVersion": "1.0.0"}, f)
MTIME = 1700000000


def put(data):
    d = hashlib.sha256(data).hexdigest()
    with open(f"{out}/blobs/sha256/{d}", "wb") as f:
        f.write(data)
    return "sha256:" + d


def tar_of(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for e in entries:
            ti = tarfile.TarInfo(e["name"])
            ti.mtime = MTIME
            ti.mode = e.get("mode", 0o644)
            ti.uid, ti.gid = e.get("uid", 0), e.get("gid", 0)
            data = e.get("data")
            kind = e.get("type", "file")
            if kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, e.get("mode", 0o755)
            elif kind == "link":
                ti.type, ti.linkname = tarfile.LNKTYPE, e["target"]
            elif kind == "symlink":
                ti.type, ti.linkname = tarfile.SYMTYPE, e["target"]
            elif kind == "chr":
                ti.type, ti.devmajor, ti.devminor = tarfile.CHRTYPE, 1, 3
            if "xattrs" in e:
                ti.pax_headers = {"SCHILY.xattr." + k: v.decode("utf-8", "surrogateescape")
                                  for k, v in e["xattrs"].items()}
            if data is not None:
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
            else:
                t.addfile(ti)
    return buf.getvalue()


def base_entries():
    """The base rootfs directory (programs for `sheaf run`), as entries."""
    ents = []
    for dirpath, dirs, files in os.walk(base):
        dirs.sort()
        rel = os.path.relpath(dirpath, base)
        if rel != ".":
            ents.append({"name": rel, "type": "dir"})
        for n in sorted(files):
            p = os.path.join(dirpath, n)
            r = os.path.normpath(os.path.join(rel, n))
            if os.path.islink(p):
                ents.append({"name": r, "type": "symlink", "target": os.readlink(p)})
            else:
                ents.append({"name": r, "data": open(p, "rb").read(),
                             "mode": os.stat(p).st_mode & 0o7777})
    return ents


CAP = struct.pack("<IIIII", 0x02000001, 1 << 10, 0, 0, 0)  # cap_net_bind_service=ep
layer1 = tar_of(base_entries() + [
    {"name": "etc", "type": "dir"},
    {"name": "etc/greeting", "data": b"hello from layer 1\n"},
    {"name": "etc/remove-me", "data": b"gone in layer 2\n"},
    {"name": "opq", "type": "dir"},
    {"name": "opq/old-a", "data": b"hidden by the opaque marker\n"},
    {"name": "opq/sub", "type": "dir"},
    {"name": "opq/sub/old-b", "data": b"also hidden\n"},
    {"name": "swap", "type": "dir"},
    {"name": "swap/inner", "data": b"a directory replaced by a file\n"},
    {"name": "dup", "data": b"first version\n"},
    {"name": "dup", "data": b"second version wins\n"},
    {"name": "owned", "data": b"owned by 1001:1002\n", "uid": 1001, "gid": 1002, "mode": 0o640},
])
layer2 = tar_of([
    {"name": "etc/.wh.remove-me", "data": b""},
    {"name": "opq", "type": "dir"},
    {"name": "opq/.wh..wh..opq", "data": b""},
    {"name": "opq/new", "data": b"the only entry of opq\n"},
    {"name": "swap", "data": b"now a file\n"},
    {"name": "data", "type": "dir"},
    {"name": "data/a", "data": b"two names, one file\n"},
    {"name": "data/b", "type": "link", "target": "data/a"},
    {"name": "data/sym", "type": "symlink", "target": "a"},
    {"name": "usr/bin/capped", "data": b"#!/bin/sh\necho capped\n", "mode": 0o755,
     "xattrs": {"security.capability": CAP}},
    {"name": "devnode", "type": "chr", "mode": 0o600},
    {"name": "work", "type": "dir"},
])
empty = tar_of([])
layer_arm = tar_of([{"name": "arch", "data": b"arm64\n"}])
layer_extra = tar_of([{"name": "extra", "data": b"only in the extra image\n"}])


def gz(b):
    return gzip.compress(b, mtime=0)


def zst(b):
    return subprocess.run(["zstd", "-q", "-c", "-3"], input=b, capture_output=True, check=True).stdout


def diff(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


def image(layers, arch, codec, tag=None):
    cfg = {
        "architecture": arch, "os": "linux",
        "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "FOO=bar"],
                   "WorkingDir": "/work",
                   "Cmd": ["/bin/sh", "-c", "echo FOO=$FOO; pwd; cat /etc/greeting"]},
        "rootfs": {"type": "layers", "diff_ids": [diff(l) for l in layers]},
        "history": [{"created_by": "mkoci.py"} for _ in layers],
    }
    cb = json.dumps(cfg).encode()
    mt = {"gz": "application/vnd.oci.image.layer.v1.tar+gzip",
          "zst": "application/vnd.oci.image.layer.v1.tar+zstd"}[codec]
    blobs = [put(gz(l) if codec == "gz" else zst(l)) for l in layers]
    sizes = [os.path.getsize(f"{out}/blobs/sha256/{b[7:]}") for b in blobs]
    m = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
         "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": put(cb), "size": len(cb)},
         "layers": [{"mediaType": mt, "digest": b, "size": s} for b, s in zip(blobs, sizes)]}
    mb = json.dumps(m).encode()
    return {"mediaType": m["mediaType"], "digest": put(mb), "size": len(mb),
            "platform": {"architecture": arch, "os": "linux"}}, blobs


if hostile:
    # One image, tag "bad", whose only layer holds the entry named HOSTILE.
    d, _ = image([tar_of([{"name": hostile, "data": b"x"}])], "amd64", "gz")
    with open(f"{out}/index.json", "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [
            dict({k: v for k, v in d.items() if k != "platform"},
                 annotations={"org.opencontainers.image.ref.name": "bad"})]}, f)
    sys.exit(0)
base_layers = [layer1, layer2, empty]
gz_desc, gz_blobs = image(base_layers, "amd64", "gz")
zst_desc, zst_blobs = image(base_layers, "amd64", "zst")
arm_desc, _ = image(base_layers + [layer_arm], "arm64", "gz")
extra_desc, extra_blobs = image(base_layers + [layer_extra], "amd64", "gz")
idx = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
       "manifests": [gz_desc, arm_desc]}
ib = json.dumps(idx).encode()
multi_desc = {"mediaType": idx["mediaType"], "digest": put(ib), "size": len(ib)}


def tagged(d, t):
    d = {k: v for k, v in d.items() if k != "platform"}
    d["annotations"] = {"org.opencontainers.image.ref.name": t}
    return d


with open(f"{out}/index.json", "w") as f:
    json.dump({"schemaVersion": 2, "manifests": [
        tagged(gz_desc, "gz"), tagged(zst_desc, "zst"), tagged(arm_desc, "arm"),
        tagged(multi_desc, "multi"), tagged(extra_desc, "extra")]}, f)
json.dump({
    "diff_ids": [diff(l) for l in base_layers],
    "extra_diff_id": diff(layer_extra),
    "gz_blobs": gz_blobs, "zst_blobs": zst_blobs, "extra_blobs": extra_blobs,
    "manifests": {"gz": gz_desc["digest"], "zst": zst_desc["digest"], "arm": arm_desc["digest"],
                  "extra": extra_desc["digest"]},
    "cap_hex": CAP.hex(),
}, sys.stdout)
