#!/usr/bin/env python3
"""PullImage through containerd's CRI (runtime.v1.ImageService), as the
kubelet does, so containerd passes the layer labels a remote snapshotter
needs (`ctr image pull` does not). crictl is not packaged in Debian, so the
two protobuf messages are encoded here by hand:
  PullImageRequest  { ImageSpec image = 1; }   ImageSpec { string image = 1; }
  PullImageResponse { string image_ref = 1; }
usage: cri_pull.py SOCKET IMAGE     prints the image ref
"""
import sys
import grpc


def field(num, payload):
    """A length-delimited protobuf field (wire type 2)."""
    n, out = len(payload), bytearray()
    tag = (num << 3) | 2
    for v in (tag, n):
        while True:
            b = v & 0x7F
            v >>= 7
            out.append(b | (0x80 if v else 0))
            if not v:
                break
    return bytes(out) + payload


def first_string(msg):
    """Field 1 of a message, as a string."""
    if not msg:
        return ""
    assert msg[0] == 0x0A, msg[:8]
    n, shift, i = 0, 0, 1
    while True:
        b = msg[i]
        n |= (b & 0x7F) << shift
        i += 1
        shift += 7
        if not b & 0x80:
            break
    return msg[i:i + n].decode()


sock, image = sys.argv[1], sys.argv[2]
ch = grpc.insecure_channel("unix://" + sock)
pull = ch.unary_unary("/runtime.v1.ImageService/PullImage",
                      request_serializer=lambda b: b, response_deserializer=lambda b: b)
resp = pull(field(1, field(1, image.encode())), timeout=300)
print(first_string(resp))
