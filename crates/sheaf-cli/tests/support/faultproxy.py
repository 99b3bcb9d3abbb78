#!/usr/bin/env python3
"""A misbehaving HTTP proxy for sheaf's tests (python3 standard library only).

Usage: faultproxy.py UPSTREAM_BASE MODE [PORT]

Binds 127.0.0.1:PORT (PORT 0 or absent: a free port) and prints the port on
stdout as its first line. It is both

  * a reverse proxy: `GET /path` is forwarded to UPSTREAM_BASE/path, and
  * a forward proxy: `GET http://host:port/path` (the absolute-URL request
    line a client sends through http_proxy) is forwarded to that URL.

The client's Range and If-Range headers are forwarded; the status,
Content-Range, Content-Length, Content-Type (and Accept-Ranges, ETag,
Last-Modified) of the answer are passed back. HEAD works too.

MODE is a comma-separated list of:
  pass              forward unchanged
  corrupt           flip one byte in the middle of every body over 100 bytes
  truncate          correct headers, only half the body, then close
  status=N          answer every request with status N, upstream untouched
  throttle=BPS      cap the body's bandwidth to BPS bytes per second
  delay=MS          wait MS milliseconds before answering each request
  hang              never answer (until the client closes the connection)

Control URLs (never forwarded, never counted):
  GET /__mode/MODE  switch to MODE at run time (400 if MODE is invalid)
  GET /__mode       the current mode
  GET /__count      how many requests were proxied (or faulted) so far
"""

import http.client
import io
import select
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PASS_BACK = (
    "Content-Range",
    "Content-Type",
    "Accept-Ranges",
    "ETag",
    "Last-Modified",
)
FORWARD = ("Range", "If-Range")

state_lock = threading.Lock()
state = {"mode": "pass", "parsed": {}, "count": 0}
UPSTREAM = ""


def parse_mode(text):
    """Parse a mode string; raises ValueError when it is not valid."""
    out = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, eq, val = part.partition("=")
        if key in ("pass", "corrupt", "truncate", "hang"):
            if eq:
                raise ValueError(f"mode {key} takes no value")
            out[key] = True
        elif key in ("status", "throttle", "delay"):
            n = int(val)
            if n < 0 or (key == "status" and not 100 <= n <= 599) or (key == "throttle" and n == 0):
                raise ValueError(f"bad value in {part}")
            out[key] = n
        else:
            raise ValueError(f"unknown mode {part!r}")
    return out


def set_mode(text):
    parsed = parse_mode(text)
    with state_lock:
        state["mode"] = text
        state["parsed"] = parsed


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "faultproxy/1"
    # An idle keep-alive connection is dropped after this many seconds.
    timeout = 120

    def log_message(self, fmt, *args):  # quiet
        pass

    def do_GET(self):
        self.handle_one(head=False)

    def do_HEAD(self):
        self.handle_one(head=True)

    def do_CONNECT(self):
        self.simple(501, "CONNECT is not supported\n")

    # --- helpers -----------------------------------------------------------

    def simple(self, status, text, head=False, close=False):
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def own_netlocs(self):
        host, port = self.server.server_address[:2]
        return {f"{host}:{port}", f"localhost:{port}"}

    def target(self):
        """(local path or None, upstream URL or None) for this request."""
        p = self.path
        if p.startswith("http://") or p.startswith("https://"):
            u = urllib.parse.urlsplit(p)
            if u.netloc in self.own_netlocs():
                p = urllib.parse.urlunsplit(("", "", u.path or "/", u.query, ""))
            else:
                return None, p
        if p.startswith("/__"):
            return p, None
        if not UPSTREAM:
            return None, None
        return None, UPSTREAM.rstrip("/") + p

    def control(self, path, head):
        if path == "/__count":
            with state_lock:
                n = state["count"]
            self.simple(200, f"{n}\n", head)
        elif path == "/__mode":
            with state_lock:
                m = state["mode"]
            self.simple(200, m + "\n", head)
        elif path.startswith("/__mode/"):
            text = urllib.parse.unquote(path[len("/__mode/"):])
            try:
                set_mode(text)
            except ValueError as e:
                self.simple(400, f"bad mode: {e}\n", head)
                return
            self.simple(200, "ok\n", head)
        else:
            self.simple(404, "unknown control URL\n", head)

    def hang(self):
        """Answer nothing; return when the client closes the connection."""
        self.close_connection = True
        sock = self.connection
        while True:
            r, _, _ = select.select([sock], [], [], 0.5)
            if r:
                try:
                    if not sock.recv(65536):
                        return
                except OSError:
                    return

    def send_body(self, resp, length, mode):
        """Copy `length` bytes (None: to EOF) of resp's body to the client,
        applying corrupt / truncate / throttle."""
        limit = length
        if mode.get("truncate") and length is not None:
            limit = length // 2
        flip = None
        if mode.get("corrupt") and length is not None and length > 100:
            flip = length // 2
        bps = mode.get("throttle")
        piece = 65536 if not bps else max(1, min(16384, bps // 20))
        sent = 0
        start = time.monotonic()
        while limit is None or sent < limit:
            want = piece if limit is None else min(piece, limit - sent)
            chunk = resp.read(want)
            if not chunk:
                break
            if flip is not None and sent <= flip < sent + len(chunk):
                b = bytearray(chunk)
                b[flip - sent] ^= 0x01
                chunk = bytes(b)
            self.wfile.write(chunk)
            sent += len(chunk)
            if bps:
                self.wfile.flush()
                ahead = start + sent / bps - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        self.wfile.flush()
        if mode.get("truncate"):
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # --- the request -------------------------------------------------------

    def handle_one(self, head):
        local, url = self.target()
        if local is not None:
            self.control(local, head)
            return
        with state_lock:
            state["count"] += 1
            mode = dict(state["parsed"])
        if "delay" in mode:
            time.sleep(mode["delay"] / 1000.0)
        if mode.get("hang"):
            self.hang()
            return
        if "status" in mode:
            n = mode["status"]
            self.simple(n, f"faultproxy: status {n}\n", head)
            return
        if url is None:
            self.simple(400, "no upstream: send an absolute URL\n", head)
            return
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http":
            self.simple(501, f"only http:// upstreams: {url}\n", head)
            return
        path = urllib.parse.urlunsplit(("", "", u.path or "/", u.query, ""))
        headers = {k: self.headers[k] for k in FORWARD if self.headers.get(k) is not None}
        try:
            conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=60)
            conn.request("HEAD" if head else "GET", path, headers=headers)
            resp = conn.getresponse()
        except OSError as e:
            self.simple(502, f"faultproxy: upstream {url}: {e}\n", head)
            return
        try:
            length = resp.getheader("Content-Length")
            length = int(length) if length is not None else None
            body = None
            if length is None and not head:
                # Unknown length (chunked): read it all to send a length.
                body = resp.read()
                length = len(body)
            self.send_response(resp.status, resp.reason)
            for h in PASS_BACK:
                v = resp.getheader(h)
                if v is not None:
                    self.send_header(h, v)
            if length is not None:
                self.send_header("Content-Length", str(length))
            self.end_headers()
            if head:
                return
            if body is not None:
                self.send_body(io.BytesIO(body), length, mode)
            else:
                self.send_body(resp, length, mode)
        finally:
            conn.close()

    def handle(self):
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError, socket.timeout, TimeoutError):
            pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            return
        super().handle_error(request, client_address)


def main():
    global UPSTREAM
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    UPSTREAM = sys.argv[1] if sys.argv[1] not in ("", "-") else ""
    try:
        set_mode(sys.argv[2])
    except ValueError as e:
        sys.exit(f"faultproxy: {e}")
    port = int(sys.argv[3]) if len(sys.argv) == 4 else 0
    srv = Server(("127.0.0.1", port), Handler)
    print(srv.server_address[1], flush=True)
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
