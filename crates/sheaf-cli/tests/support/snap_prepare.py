#!/usr/bin/env python3
"""Prepare a snapshot through containerd's own snapshots service
(containerd.services.snapshots.v1.Snapshots/Prepare) in a namespace of our
choosing, with labels, as CRI does for a layer in k8s.io, so a test can use
the snapshotter from a second namespace (ctr passes no labels). The request
is encoded here by hand:
  PrepareSnapshotRequest { string snapshotter = 1; string key = 2;
                           string parent = 3; map<string,string> labels = 4; }
env SNAP_LEASE=ID (optional): prepare under that lease
usage: snap_prepare.py SOCKET NAMESPACE SNAPSHOTTER KEY PARENT [LABEL=VALUE...]
prints "prepared" or "exists" (ALREADY_EXISTS: committed remotely)
"""
import os
import sys
import grpc


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def field(num, payload):
    return varint((num << 3) | 2) + varint(len(payload)) + payload


sock, ns, snapshotter, key, parent = sys.argv[1:6]
msg = field(1, snapshotter.encode()) + field(2, key.encode())
if parent:
    msg += field(3, parent.encode())
for kv in sys.argv[6:]:
    k, v = kv.split("=", 1)
    msg += field(4, field(1, k.encode()) + field(2, v.encode()))
ch = grpc.insecure_channel("unix://" + sock)
prepare = ch.unary_unary("/containerd.services.snapshots.v1.Snapshots/Prepare",
                         request_serializer=lambda b: b, response_deserializer=lambda b: b)
# SNAP_LEASE: a lease (ctr leases create) that holds the snapshot against GC.
md = [("containerd-namespace", ns)]
if os.environ.get("SNAP_LEASE"):
    md.append(("containerd-lease", os.environ["SNAP_LEASE"]))
try:
    prepare(msg, timeout=60, metadata=md)
    print("prepared")
except grpc.RpcError as e:
    if e.code() == grpc.StatusCode.ALREADY_EXISTS:
        print("exists")
    else:
        sys.exit(f"prepare {key}: {e.code()}: {e.details()}")
