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
