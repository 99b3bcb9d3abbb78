"""Fixtures of the sheaf Python package's tests: the real `sheaf` command to
build images, a real nginx on loopback, and an isolated site policy and
node cache for every test. A missing prerequisite fails, never skips."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")


def sheaf_bin() -> Path:
    p = Path(os.environ.get("SHEAF_BIN") or TARGET / "release" / "sheaf")
    assert p.is_file(), f"{p}: the sheaf command is needed to build test images (make build)"
    return p


def run(*args, env=None, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def build(src: Path, out: Path, *opts) -> Path:
    run(sheaf_bin(), "build", src, "-o", out, "-q", *opts)
    return out


def write_tree(root: Path, files: dict) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


@pytest.fixture(autouse=True)
def isolated(tmp_path_factory, monkeypatch):
    """No site policy but the test's own, and a node cache of its own."""
    d = tmp_path_factory.mktemp("site")
    conf = d / "config.toml"
    conf.write_text("")
    monkeypatch.setenv("SHEAF_CONFIG", str(conf))
    monkeypatch.setenv("SHEAF_CACHE_DIR", str(d / "cache"))
    for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "SHEAF_PROXY"):
        monkeypatch.delenv(k, raising=False)
    yield conf


@pytest.fixture
def rng():
    return random.Random(40)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """nginx serving `www` on 127.0.0.1, logging each request's body bytes."""

    def __init__(self, dir: Path, www: Path):
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        assert Path(nginx).exists(), "nginx is needed (apt-get install nginx-light)"
        self.port = free_port()
        self.www = www
        t = dir / f"nginx-{self.port}"
        t.mkdir(parents=True)
        self.access = t / "access.log"
        conf = t / "nginx.conf"
        conf.write_text(
            f"daemon off;\nmaster_process off;\npid {t}/nginx.pid;\nerror_log {t}/error.log;\n"
            "events { worker_connections 256; }\n"
            "http { log_format bytes '$request_uri $status $body_bytes_sent';\n"
            f"access_log {self.access} bytes;\n"
            f"client_body_temp_path {t}; proxy_temp_path {t}; fastcgi_temp_path {t};\n"
            f"uwsgi_temp_path {t}; scgi_temp_path {t};\n"
            f"server {{ listen 127.0.0.1:{self.port}; root {www}; }} }}\n"
        )
        self.proc = subprocess.Popen(
            [nginx, "-e", str(t / "error.log"), "-c", str(conf)],
            stdin=subprocess.DEVNULL,
        )
        deadline = time.time() + 10
        while True:
            assert self.proc.poll() is None, f"nginx exited: {(t / 'error.log').read_text()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "nginx did not start in 10 s"
                time.sleep(0.05)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name.lstrip('/')}"

    def requests(self):
        """(uri, status, body bytes) of every request so far."""
        out = []
        if self.access.exists():
            for line in self.access.read_text().splitlines():
                uri, status, n = line.rsplit(" ", 2)
                out.append((uri, int(status), int(n)))
        return out

    def bytes_sent(self) -> int:
        return sum(n for _, _, n in self.requests())

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def nginx(tmp_path):
    www = tmp_path / "www"
    www.mkdir()
    n = Nginx(tmp_path, www)
    yield n
    n.stop()


class Sshd:
    """sshd on 127.0.0.1 with its own host and client keys, config and log;
    `ssh_command` reaches it with nothing of the user's or system's ssh
    configuration (sheaf runs it through $SHEAF_SSH)."""

    def __init__(self, dir: Path):
        sshd = "/usr/sbin/sshd"
        assert Path(sshd).is_file(), "sshd is needed (apt-get install openssh-server)"
        self.port = free_port()
        d = (dir / f"sshd-{self.port}").resolve()
        d.mkdir(parents=True)
        for name in ("host_ed25519_key", "client_ed25519_key"):
            run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", d / name)
        shutil.copy(d / "client_ed25519_key.pub", d / "authorized_keys")
        # sshd wants its privilege separation directory.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        sftp = "/usr/lib/openssh/sftp-server"
        conf = d / "sshd_config"
        conf.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nAddressFamily inet\n"
            f"HostKey {d}/host_ed25519_key\nPidFile {d}/sshd.pid\n"
            f"AuthorizedKeysFile {d}/authorized_keys\nPubkeyAuthentication yes\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nUseDNS no\n"
            "PrintMotd no\nPrintLastLog no\nX11Forwarding no\nAllowTcpForwarding no\n"
            f"Subsystem sftp {sftp if Path(sftp).is_file() else 'internal-sftp'}\n"
        )
        self.key = d / "client_ed25519_key"
        self.user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        self.log = d / "sshd.log"
        self.proc = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(conf)], cwd=d, stdin=subprocess.DEVNULL,
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 20
        while True:
            assert self.proc.poll() is None, f"sshd exited: {self.log.read_text()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "sshd did not start in 20 s"
                time.sleep(0.05)

    def ssh_command(self) -> str:
        opts = [
            "-F", "/dev/null", "-p", str(self.port), "-i", str(self.key),
            "-o", "IdentitiesOnly=yes", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no",
            "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=20",
        ]
        return " ".join(["ssh"] + opts)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def sshd(tmp_path, monkeypatch):
    s = Sshd(tmp_path)
    monkeypatch.setenv("SHEAF_SSH", s.ssh_command())
    yield s
    s.stop()


class SeaweedS3:
    """SeaweedFS (`weed server`: master, volume, filer and S3 gateway in one
    process) on 127.0.0.1 with authentication on, as tests/common/servers.rs
    starts it for the CLI's tests: one identity (ACCESS_KEY / SECRET_KEY),
    anonymous requests refused. Buckets are made and objects put through the
    filer's own HTTP API (no S3 client in the tests)."""

    ACCESS_KEY = "sheafTestAccessKey"
    SECRET_KEY = "sheafTestSecretKey0123456789"

    def __init__(self, dir: Path):
        weed = shutil.which("weed")
        assert weed, "weed (SeaweedFS) is needed: scripts/deps.sh test builds it"
        self.port = free_port()
        wd = (dir / f"weed-{self.port}").resolve()
        (wd / "data").mkdir(parents=True)
        config = wd / "s3.json"
        config.write_text(
            '{"identities":[{"name":"sheaf-test","credentials":[{"accessKey":"%s","secretKey":"%s"}],'
            '"actions":["Admin","Read","List","Tagging","Write"]}]}' % (self.ACCESS_KEY, self.SECRET_KEY)
        )
        self.ports = [self.port] + [free_port() for _ in range(7)]
        m, mg, v, vg, self.filer_port, fg, s3g = self.ports[1:]
        args = [
            weed, "server", f"-dir={wd / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={m}", f"-master.port.grpc={mg}", "-master.volumeSizeLimitMB=64",
            f"-volume.port={v}", f"-volume.port.grpc={vg}", "-volume.max=8",
            f"-filer.port={self.filer_port}", f"-filer.port.grpc={fg}",
            "-s3", f"-s3.port={self.port}", f"-s3.port.grpc={s3g}", f"-s3.config={config}",
            "-s3.autoCreateBucket=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-volume.preStopSeconds=0",
        ]
        self.log = wd / "weed.log"
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT
        )
        deadline = time.time() + 90
        for port in (self.port, self.filer_port):
            while True:
                assert self.proc.poll() is None, f"weed exited: {self.log.read_text()[-3000:]}"
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert time.time() < deadline, f"weed did not start in 90 s: {self.log.read_text()[-3000:]}"
                    time.sleep(0.2)
        # The gateway listens before the filer behind it answers.
        while self._filer("GET", "/?pretty=y") >= 500:
            assert time.time() < deadline, f"weed's filer never answered: {self.log.read_text()[-3000:]}"
            time.sleep(0.2)

    def _filer(self, method: str, path: str, body: bytes = b"") -> int:
        import http.client

        c = http.client.HTTPConnection("127.0.0.1", self.filer_port, timeout=60)
        try:
            headers = {"Content-Type": "application/octet-stream"} if body else {}
            c.request(method, path, body=body, headers=headers)
            return c.getresponse().status
        except OSError:
            return 599
        finally:
            c.close()

    def make_bucket(self, name: str):
        st = self._filer("POST", f"/buckets/{name}/")
        assert st < 300, f"making bucket {name}: HTTP {st}"

    def put_file(self, bucket: str, key: str, src: Path):
        st = self._filer("PUT", f"/buckets/{bucket}/{key}", Path(src).read_bytes())
        assert st < 300, f"putting {bucket}/{key}: HTTP {st}"

    def env(self) -> dict:
        """What sheaf (and the AWS CLI) read to reach it."""
        return {
            "AWS_ACCESS_KEY_ID": self.ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": self.SECRET_KEY,
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
            "AWS_REGION": "us-east-1",
        }

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # The Unix sockets weed leaves in /tmp, named after its ports.
        for p in self.ports:
            for s in Path("/tmp").glob(f"seaweedfs-*-{p}.sock"):
                s.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    s = SeaweedS3(tmp_path_factory.mktemp("s3"))
    yield s
    s.stop()
