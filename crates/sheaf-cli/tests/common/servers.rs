//! Real servers on loopback for the HTTP and SSH tests, each a child process
//! killed on drop: [`Nginx`] (a static file server with Range support),
//! [`SeaweedS3`] (an S3 server with authentication on),
//! [`Squid`] (a caching forward proxy), [`FaultProxy`] (a proxy that
//! corrupts, truncates, fails, slows or hangs on demand:
//! tests/support/faultproxy.py) and [`Sshd`] (an OpenSSH server with its own
//! keys, for `ssh` and sshfs, [`SshfsMount`]).

use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// A port that was free a moment ago on 127.0.0.1, and that no other
/// caller in this test process was given: the kernel may hand a released
/// port out again, and tests that start servers at once (a SeaweedFS server
/// takes nine ports) would then find another test's server on theirs.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let p = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(p) {
            return p;
        }
    }
}

/// The last `n` lines of a (log) file, or a note that it cannot be read.
pub fn tail(p: &Path, n: usize) -> String {
    match fs::read(p) {
        Ok(b) => {
            let s = String::from_utf8_lossy(&b);
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("({}: {e})", p.display()),
    }
}

/// Path of program `name`: from PATH, else /usr/sbin or /sbin (not in a
/// non-root user's PATH on Debian, where nginx and squid are).
pub fn program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Wait until 127.0.0.1:`port` accepts connections; panic (with `log`'s tail)
/// if `child` exits first or `timeout` passes.
fn wait_port(child: &mut Child, port: u16, what: &str, log: &Path, timeout: Duration) {
    let t0 = Instant::now();
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "{what} exited ({st}) before listening on port {port}; {}:\n{}",
                log.display(),
                tail(log, 30)
            );
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not listen on port {port} within {timeout:?}; {}:\n{}",
                log.display(),
                tail(log, 30)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One HTTP/1.1 GET of `path` on 127.0.0.1:`port`: (status, body).
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connect 127.0.0.1:{port}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .unwrap_or_else(|e| panic!("GET {path} on port {port}: {e}"));
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("GET {path} on port {port}: bad answer {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// nginx serving a directory on 127.0.0.1 (`daemon off; master_process off`).
pub struct Nginx {
    child: Child,
    pub port: u16,
    /// The directory served.
    pub www: PathBuf,
    /// nginx's error log.
    pub log: PathBuf,
    scheme: &'static str,
    conf: PathBuf,
}

impl Nginx {
    /// Serve `dir/www` (created); config and temporaries go in `dir`.
    pub fn start(dir: &Path) -> Nginx {
        Nginx::start_with_root(dir, &dir.join("www"))
    }

    /// Serve `www` (created if missing); config and temporaries go in `dir`
    /// under names with the port in them, so several nginx (e.g. a mirror of
    /// the same `www`) can share one `dir`.
    pub fn start_with_root(dir: &Path, www: &Path) -> Nginx {
        Nginx::start_inner(dir, www, None, None)
    }

    /// As [`Nginx::start_with_root`], listening on `addr` (e.g. the host's
    /// address on a bridge of network namespaces) as well as on 127.0.0.1.
    pub fn start_also_on(dir: &Path, www: &Path, addr: &str) -> Nginx {
        Nginx::start_inner(dir, www, None, Some(addr))
    }

    /// Serve `www` over HTTPS with this certificate chain and key (PEM);
    /// `url()` and `base()` then give `https://` URLs.
    pub fn start_tls(dir: &Path, www: &Path, cert: &Path, key: &Path) -> Nginx {
        Nginx::start_inner(dir, www, Some((cert, key)), None)
    }

    fn start_inner(
        dir: &Path,
        www: &Path,
        tls: Option<(&Path, &Path)>,
        also: Option<&str>,
    ) -> Nginx {
        let port = free_port();
        let tmp = dir.join(format!("nginx-{port}-tmp"));
        fs::create_dir_all(www).unwrap();
        fs::create_dir_all(&tmp).unwrap();
        let www = www.canonicalize().unwrap();
        let t = tmp.display();
        let log = tmp.join("error.log");
        let conf = dir.join(format!("nginx-{port}.conf"));
        fs::write(
            &conf,
            format!(
                "daemon off;\nmaster_process off;\npid {t}/nginx.pid;\nerror_log {t}/error.log;\n\
                 events {{ worker_connections 256; }}\n\
                 http {{ access_log off; client_body_temp_path {t}; proxy_temp_path {t};\n\
                 fastcgi_temp_path {t}; uwsgi_temp_path {t}; scgi_temp_path {t};\n\
                 server {{ listen 127.0.0.1:{port}{}; {}root {}; {} }} }}\n",
                if tls.is_some() { " ssl" } else { "" },
                also.map(|a| format!("listen {a}:{port}; "))
                    .unwrap_or_default(),
                www.display(),
                tls.map(|(c, k)| format!(
                    "ssl_certificate {}; ssl_certificate_key {};",
                    c.display(),
                    k.display()
                ))
                .unwrap_or_default()
            ),
        )
        .unwrap();
        let child = Nginx::spawn(&conf, &log, port);
        Nginx {
            child,
            port,
            www,
            log,
            scheme: if tls.is_some() { "https" } else { "http" },
            conf,
        }
    }

    fn spawn(conf: &Path, log: &Path, port: u16) -> Child {
        let mut child = Command::new(program("nginx"))
            .arg("-e")
            .arg(log)
            .arg("-c")
            .arg(conf)
            .stdin(Stdio::null())
            .spawn()
            .expect("nginx (apt-get install nginx-light)");
        wait_port(&mut child, port, "nginx", log, Duration::from_secs(10));
        child
    }

    /// Start the server again, on the same port, after `stop`.
    pub fn restart(&mut self) {
        self.stop();
        self.child = Nginx::spawn(&self.conf, &self.log, self.port);
    }

    /// URL of `name` (relative to `www`).
    pub fn url(&self, name: &str) -> String {
        format!("{}/{}", self.base(), name.trim_start_matches('/'))
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn base(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.port)
    }

    /// Kill the server (it refuses connections from then on).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.stop();
    }
}

/// SeaweedFS (`weed server`: master, volume, filer and S3 gateway in one
/// process) on 127.0.0.1 with authentication on: one identity,
/// [`SeaweedS3::ACCESS_KEY`] / [`SeaweedS3::SECRET_KEY`], may do anything;
/// anonymous requests are refused. Data, config and log in `dir/weed-PORT`.
/// Buckets are made, and whole objects put, through the filer's own HTTP
/// API (no S3 client in the tests).
pub struct SeaweedS3 {
    child: Child,
    /// The S3 port.
    pub port: u16,
    /// The filer's HTTP port.
    pub filer_port: u16,
    args: Vec<String>,
    log: PathBuf,
    /// Every port it was given (it names Unix sockets in /tmp after them).
    ports: Vec<u16>,
}

impl SeaweedS3 {
    pub const ACCESS_KEY: &'static str = "sheafTestAccessKey";
    pub const SECRET_KEY: &'static str = "sheafTestSecretKey0123456789";

    /// Start `weed server -s3` (from PATH: scripts/deps.sh installs it);
    /// returns once the S3 gateway answers.
    pub fn start(dir: &Path) -> SeaweedS3 {
        let port = free_port();
        let wd = dir.join(format!("weed-{port}"));
        fs::create_dir_all(wd.join("data")).unwrap();
        let wd = wd.canonicalize().unwrap();
        let config = wd.join("s3.json");
        fs::write(
            &config,
            format!(
                r#"{{"identities":[{{"name":"sheaf-test","credentials":[{{"accessKey":"{}","secretKey":"{}"}}],"actions":["Admin","Read","List","Tagging","Write"]}}]}}"#,
                Self::ACCESS_KEY,
                Self::SECRET_KEY
            ),
        )
        .unwrap();
        let mut ports = vec![port];
        let mut p = || {
            let n = free_port();
            ports.push(n);
            n.to_string()
        };
        let filer_port = p().parse().unwrap();
        let args: Vec<String> = [
            "server".to_string(),
            format!("-dir={}", wd.join("data").display()),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            format!("-master.port={}", p()),
            format!("-master.port.grpc={}", p()),
            "-master.volumeSizeLimitMB=64".into(),
            format!("-volume.port={}", p()),
            format!("-volume.port.grpc={}", p()),
            "-volume.max=8".into(),
            format!("-filer.port={filer_port}"),
            format!("-filer.port.grpc={}", p()),
            "-s3".into(),
            format!("-s3.port={port}"),
            format!("-s3.port.grpc={}", p()),
            format!("-s3.config={}", config.display()),
            // Like S3: no bucket made by a PUT; no extra fixed ports.
            "-s3.autoCreateBucket=false".into(),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            "-volume.preStopSeconds=0".into(),
        ]
        .into();
        let log = wd.join("weed.log");
        let mut w = SeaweedS3 {
            child: Self::spawn(&args, &log),
            port,
            filer_port,
            args,
            log,
            ports,
        };
        w.wait_ready();
        w
    }

    fn spawn(args: &[String], log: &Path) -> Child {
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        Command::new(program("weed"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("weed (SeaweedFS; scripts/deps.sh installs it)")
    }

    /// Wait until the S3 gateway and the filer answer HTTP (any status).
    fn wait_ready(&mut self) {
        wait_port(
            &mut self.child,
            self.port,
            "weed s3",
            &self.log,
            Duration::from_secs(60),
        );
        wait_port(
            &mut self.child,
            self.filer_port,
            "weed filer",
            &self.log,
            Duration::from_secs(60),
        );
        // The gateway listens before the filer is reachable behind it; a
        // bucket listing through the filer shows both are up.
        let t0 = Instant::now();
        loop {
            let (st, _) = http_get(self.filer_port, "/?pretty=y");
            if st < 500 {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "weed's filer never answered; {}:\n{}",
                self.log.display(),
                tail(&self.log, 30)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `http://127.0.0.1:PORT`: the S3 endpoint (`AWS_ENDPOINT_URL`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One raw request to the filer; its status.
    fn filer(&self, method: &str, path: &str, body: &[u8]) -> u16 {
        let mut s = TcpStream::connect(("127.0.0.1", self.filer_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{}Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.filer_port,
            // An empty POST is a mkdir only without a content type.
            if body.is_empty() {
                ""
            } else {
                "Content-Type: application/octet-stream\r\n"
            },
            body.len()
        )
        .unwrap();
        s.write_all(body).unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf);
        text.split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("{method} {path} on the filer: bad answer {text:?}"))
    }

    /// Make bucket `name` (a directory under the filer's /buckets).
    pub fn make_bucket(&self, name: &str) {
        let st = self.filer("POST", &format!("/buckets/{name}/"), b"");
        assert!(
            st < 300,
            "making bucket {name}: HTTP {st}\n{}",
            tail(&self.log, 20)
        );
    }

    /// Put the file `src` as object `bucket/key`.
    pub fn put_file(&self, bucket: &str, key: &str, src: &Path) {
        let st = self.filer(
            "PUT",
            &format!("/buckets/{bucket}/{key}"),
            &fs::read(src).unwrap(),
        );
        assert!(
            st < 300,
            "putting {bucket}/{key}: HTTP {st}\n{}",
            tail(&self.log, 20)
        );
    }

    /// Kill the server (every port refuses connections from then on).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Freeze (SIGSTOP) or thaw (SIGCONT) the server: connections are
    /// accepted by the kernel but never answered while frozen.
    pub fn freeze(&self, frozen: bool) {
        let sig = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Start it again on the same ports and data, after `stop`.
    pub fn restart(&mut self) {
        self.stop();
        self.child = Self::spawn(&self.args, &self.log);
        self.wait_ready();
    }
}

impl Drop for SeaweedS3 {
    fn drop(&mut self) {
        self.stop();
        // The gRPC and HTTP Unix sockets weed leaves in /tmp
        // (seaweedfs-KIND-PORT.sock).
        if let Ok(d) = fs::read_dir("/tmp") {
            for e in d.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with("seaweedfs-")
                    && self
                        .ports
                        .iter()
                        .any(|p| n.ends_with(&format!("-{p}.sock")))
                {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
}

/// A real squid as a caching forward proxy on 127.0.0.1 (`proxy_url()`),
/// with its config, cache_dir (ufs), logs and pid file in its own directory.
/// Whole responses are cached (up to 64 MB); Range requests for an object
/// not in the cache are forwarded as they are and not cached (squid's
/// default `range_offset_limit 0`); a Range request for a cached object is
/// served from the cache.
pub struct Squid {
    child: Child,
    pub port: u16,
    /// Where its config, cache, logs and pid file are.
    pub dir: PathBuf,
    /// Service name (`squid -n`), which also names its /dev/shm segments.
    name: String,
}

impl Squid {
    /// Start squid with its files in `dir/squid-PORT`; returns once it accepts
    /// connections. Runs as `proxy` (or `nobody`) when started as root: squid
    /// refuses to run as root, so then the directory is chowned to that user and
    /// `dir`'s ancestors are made traversable (o+x) where they are not.
    pub fn start(dir: &Path) -> Squid {
        let port = free_port();
        let name = format!("sheafsq{port}");
        let sd = dir.join(format!("squid-{port}"));
        fs::create_dir_all(sd.join("cache")).unwrap();
        let sd = sd.canonicalize().unwrap();
        let d = sd.display();
        let user = if unsafe { libc::geteuid() } == 0 {
            let (user, uid, gid) = ["proxy", "nobody"]
                .iter()
                .find_map(|u| user_ids(u).map(|(uid, gid)| (*u, uid, gid)))
                .expect("squid runs as root only with a user `proxy` or `nobody` to switch to");
            for e in walk_all(&sd) {
                super::lchown(&e, uid, gid);
            }
            for a in sd.ancestors().skip(1) {
                let m = fs::metadata(a).unwrap().mode();
                if m & 0o001 == 0 {
                    fs::set_permissions(a, fs::Permissions::from_mode((m & 0o7777) | 0o001))
                        .unwrap();
                }
            }
            format!("cache_effective_user {user}\n")
        } else {
            String::new()
        };
        // Gotchas: `-n NAME` (unique per instance) names squid's /dev/shm
        // segments, which would otherwise clash between instances and with a
        // system squid; `visible_hostname` spares a hostname lookup that can be
        // fatal; `cache_dir ... 4 16` makes 64 directories in `squid -z` where
        // the usual 16 256 makes 4096 (seconds on a busy disk); the default
        // config is never read (`-f`); the ACL is not named `localhost`, which
        // squid predefines.
        let conf = sd.join("squid.conf");
        fs::write(
            &conf,
            format!(
                "# Written by the sheaf tests (tests/common/servers.rs).\n\
                 http_port 127.0.0.1:{port}\n\
                 {user}\
                 visible_hostname sheaf-test-squid\n\
                 pid_filename {d}/squid.pid\n\
                 cache_log {d}/cache.log\n\
                 access_log stdio:{d}/access.log squid\n\
                 cache_store_log none\n\
                 logfile_rotate 0\n\
                 coredump_dir {d}\n\
                 cache_dir ufs {d}/cache 100 4 16\n\
                 cache_mem 64 MB\n\
                 maximum_object_size 64 MB\n\
                 maximum_object_size_in_memory 16 MB\n\
                 refresh_pattern . 1440 100% 10080\n\
                 pinger_enable off\n\
                 shutdown_lifetime 1 seconds\n\
                 client_db off\n\
                 acl sheaf_clients src 127.0.0.1/32\n\
                 http_access allow sheaf_clients\n\
                 http_access deny all\n"
            ),
        )
        .unwrap();
        let log = sd.join("cache.log");
        let out = sd.join("squid.out");
        let squid = |args: &[&str]| {
            let o = fs::File::create(&out).unwrap();
            let mut c = Command::new(program("squid"));
            c.arg("-n")
                .arg(&name)
                .args(args)
                .arg("-N")
                .arg("-f")
                .arg(&conf)
                .current_dir(&sd)
                .stdin(Stdio::null())
                .stdout(o.try_clone().unwrap())
                .stderr(o);
            c
        };
        // Create the cache directories (in the foreground: -N).
        let st = squid(&["-z"])
            .status()
            .expect("squid (apt-get install squid)");
        assert!(
            st.success(),
            "squid -z failed ({st}); {}:\n{}\n{}",
            log.display(),
            tail(&log, 30),
            tail(&out, 10)
        );
        let mut child = squid(&[]).spawn().expect("squid");
        wait_port(&mut child, port, "squid", &log, Duration::from_secs(30));
        Squid {
            child,
            port,
            dir: sd,
            name,
        }
    }

    /// `http://127.0.0.1:PORT`, for `http_proxy` or `curl -x`.
    pub fn proxy_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The access log so far (one line per finished request).
    pub fn access_log(&self) -> String {
        fs::read_to_string(self.dir.join("access.log")).unwrap_or_default()
    }

    /// (served from the cache, forwarded to the origin) over the requests
    /// logged so far: TCP_HIT, TCP_MEM_HIT, TCP_REFRESH_UNMODIFIED and other
    /// *_HIT codes vs TCP_MISS, TCP_REFRESH_MODIFIED and other *_MISS codes.
    /// Denied or aborted-before-forwarding requests count as neither.
    pub fn hits(&self) -> (u64, u64) {
        let (mut hits, mut misses) = (0, 0);
        for l in self.access_log().lines() {
            let Some(code) = l.split_whitespace().nth(3) else {
                continue;
            };
            let tag = code.split('/').next().unwrap_or("");
            if tag.contains("HIT") || tag == "TCP_REFRESH_UNMODIFIED" {
                hits += 1;
            } else if tag.contains("MISS") || tag.starts_with("TCP_REFRESH") {
                misses += 1;
            }
        }
        (hits, misses)
    }

    /// [`hits`](Self::hits) once at least `n` requests are counted (squid
    /// logs a request just after answering it); panics after 10 s.
    pub fn wait_hits(&self, n: u64) -> (u64, u64) {
        let t0 = Instant::now();
        loop {
            let (h, m) = self.hits();
            if h + m >= n {
                return (h, m);
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "squid logged {h} hits + {m} misses, waited for {n}:\n{}",
                self.access_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kill squid now (it refuses connections from then on).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // SIGKILL leaves squid's shared memory segments behind.
        if let Ok(rd) = fs::read_dir("/dev/shm") {
            let prefix = format!("{}-", self.name);
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
}

impl Drop for Squid {
    fn drop(&mut self) {
        self.stop();
    }
}

/// (uid, gid) of a user in the password database.
fn user_ids(name: &str) -> Option<(u32, u32)> {
    let c = std::ffi::CString::new(name).unwrap();
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    if pw.is_null() {
        None
    } else {
        Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
    }
}

/// `root` and everything under it.
fn walk_all(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if fs::symlink_metadata(&out[i]).unwrap().is_dir() {
            let mut more: Vec<PathBuf> = fs::read_dir(&out[i])
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            out.append(&mut more);
        }
        i += 1;
    }
    out
}

/// tests/support/faultproxy.py on 127.0.0.1: a reverse proxy to an upstream
/// base URL (`url(name)`), and a forward proxy for absolute-URL requests
/// (`base()` as `http_proxy`), that misbehaves as its mode says: `pass`,
/// `corrupt`, `truncate`, `status=N`, `throttle=BYTES_PER_SEC`, `delay=MS`,
/// `hang`, combinable with commas (see the script's doc).
pub struct FaultProxy {
    child: Child,
    pub port: u16,
    pub upstream: String,
    _stdout: BufReader<ChildStdout>,
}

impl FaultProxy {
    /// Path of the script.
    pub fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/faultproxy.py")
    }

    /// Proxy to `upstream_base` (e.g. `nginx.base()`; `""` for a forward
    /// proxy only) in `mode`; returns once it listens.
    pub fn start(upstream_base: &str, mode: &str) -> FaultProxy {
        let up = if upstream_base.is_empty() {
            "-"
        } else {
            upstream_base
        };
        let mut child = Command::new("python3")
            .arg(Self::script())
            .arg(up)
            .arg(mode)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let _ = stdout.read_line(&mut line);
        let port = match line.trim().parse::<u16>() {
            Ok(p) => p,
            Err(_) => {
                let _ = child.kill();
                let st = child.wait();
                panic!("faultproxy.py {up} {mode} did not start ({st:?}); first line: {line:?}")
            }
        };
        FaultProxy {
            child,
            port,
            upstream: upstream_base.to_string(),
            _stdout: stdout,
        }
    }

    /// `http://127.0.0.1:PORT` (no trailing slash); also the URL to use
    /// as `http_proxy`.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// URL on the proxy for upstream's `name`.
    pub fn url(&self, name: &str) -> String {
        format!("{}/{}", self.base(), name.trim_start_matches('/'))
    }

    /// Change the mode from now on (requests being answered keep theirs).
    #[track_caller]
    pub fn set_mode(&self, mode: &str) {
        let (st, body) = http_get(self.port, &format!("/__mode/{mode}"));
        assert_eq!(st, 200, "faultproxy: set mode {mode:?}: {body}");
    }

    /// The current mode.
    pub fn mode(&self) -> String {
        http_get(self.port, "/__mode").1.trim().to_string()
    }

    /// Requests received so far (proxied or faulted; control URLs excluded).
    pub fn count(&self) -> u64 {
        let (st, body) = http_get(self.port, "/__count");
        assert_eq!(st, 200, "faultproxy /__count: {body}");
        body.trim()
            .parse()
            .unwrap_or_else(|_| panic!("faultproxy /__count: {body:?}"))
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A real OpenSSH server on 127.0.0.1 (`/usr/sbin/sshd -D -e -f CONFIG`)
/// with its own host key, one client key (both ed25519, made by ssh-keygen),
/// authorized_keys, config, pid file and log in its own directory. Public-key
/// logins only; no PAM, so no MOTD or session noise on stdout (sftp needs a
/// clean channel). Logs in as the user running the tests (`user`, which a test
/// may change to another local user when running as root).
///
/// The session's PATH is sshd's built-in minimal one: run the binary under
/// test by its absolute path ([`bin()`](super::bin) is one). Variables passed
/// to [`start_with_env`](Self::start_with_env) are set in every session
/// (sshd's `SetEnv`), e.g. `SHEAF_CACHE_DIR`; the client may also send
/// `SHEAF_*`, `LANG` and `LC_*` (`AcceptEnv`).
///
/// On drop (or [`stop`](Self::stop)) every process it started (connections,
/// sessions, their commands) gets SIGTERM, then SIGKILL if still there after
/// 5 s, and the server is killed. Declare an [`SshfsMount`] after its `Sshd`
/// so that it is dropped (unmounted) first.
pub struct Sshd {
    child: Child,
    pub port: u16,
    /// Its config, keys, authorized_keys, pid file and log.
    pub dir: PathBuf,
    /// The client's private key (`-i`).
    pub key: PathBuf,
    /// The user `ssh()` and sshfs log in as.
    pub user: String,
    /// sshd's log (`-e`: everything it would send to syslog).
    pub log: PathBuf,
}

/// sshd's path: it must be absolute (sshd re-executes itself per connection).
fn sshd_program() -> PathBuf {
    let p = program("sshd");
    assert!(
        p.is_absolute() && p.is_file(),
        "sshd not found (apt-get install openssh-server, or scripts/deps.sh)"
    );
    p
}

impl Sshd {
    /// Start sshd with its files in `dir/sshd-PORT`; returns once it accepts
    /// connections.
    pub fn start(dir: &Path) -> Sshd {
        Sshd::start_with_env(dir, &[])
    }

    /// [`start`](Self::start), with these variables set in every session.
    pub fn start_with_env(dir: &Path, env: &[(&str, &str)]) -> Sshd {
        let port = free_port();
        let sd = dir.join(format!("sshd-{port}"));
        fs::create_dir_all(&sd).unwrap();
        let sd = sd.canonicalize().unwrap();
        // ssh_command for sshfs is split on spaces, and config values too.
        assert!(
            !sd.to_string_lossy().contains(char::is_whitespace),
            "Sshd: no spaces in {}",
            sd.display()
        );
        let d = sd.display();
        let keygen = |file: &str, comment: &str| {
            let o = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
                .arg(sd.join(file))
                .stdin(Stdio::null())
                .output()
                .expect("ssh-keygen (apt-get install openssh-client)");
            assert!(
                o.status.success(),
                "ssh-keygen -f {file}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        keygen("host_ed25519_key", "sheaf-test-host");
        keygen("client_ed25519_key", "sheaf-test-client");
        fs::copy(
            sd.join("client_ed25519_key.pub"),
            sd.join("authorized_keys"),
        )
        .unwrap();
        // sshd refuses to start without its privilege separation directory
        // (root-owned, not group/world writable); a fresh container lacks it.
        let privsep = Path::new("/run/sshd");
        if !privsep.is_dir() && super::is_root() {
            fs::create_dir_all(privsep).unwrap();
            fs::set_permissions(privsep, fs::Permissions::from_mode(0o755)).unwrap();
        }
        let setenv: String = env
            .iter()
            .map(|(k, v)| {
                assert!(
                    !k.is_empty() && !k.contains(['=', ' ', '"']) && !v.contains(['"', '\n']),
                    "Sshd: bad SetEnv {k}={v}"
                );
                format!("SetEnv \"{k}={v}\"\n")
            })
            .collect();
        let sftp = Path::new("/usr/lib/openssh/sftp-server");
        let subsystem = if sftp.is_file() {
            sftp.display().to_string()
        } else {
            "internal-sftp".to_string()
        };
        // Gotchas: the system config is never read (-f); StrictModes no
        // because the temporary directories may be group/world readable; no
        // PAM (it would want a password or print session messages), which
        // also means sshd checks the account is not locked (`!` in shadow).
        let conf = sd.join("sshd_config");
        fs::write(
            &conf,
            format!(
                "# Written by the sheaf tests (tests/common/servers.rs).\n\
                 Port {port}\n\
                 ListenAddress 127.0.0.1\n\
                 AddressFamily inet\n\
                 HostKey {d}/host_ed25519_key\n\
                 PidFile {d}/sshd.pid\n\
                 AuthorizedKeysFile {d}/authorized_keys\n\
                 PubkeyAuthentication yes\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 PermitRootLogin prohibit-password\n\
                 StrictModes no\n\
                 UsePAM no\n\
                 UseDNS no\n\
                 PrintMotd no\n\
                 PrintLastLog no\n\
                 X11Forwarding no\n\
                 AllowTcpForwarding no\n\
                 PermitUserEnvironment no\n\
                 MaxStartups 100\n\
                 MaxSessions 100\n\
                 LogLevel VERBOSE\n\
                 AcceptEnv LANG LC_* SHEAF_*\n\
                 {setenv}\
                 Subsystem sftp {subsystem}\n"
            ),
        )
        .unwrap();
        let log = sd.join("sshd.log");
        fs::File::create(&log).unwrap();
        let child = Sshd::spawn(&sd, port, &log);
        Sshd {
            child,
            port,
            key: sd.join("client_ed25519_key"),
            dir: sd,
            user: current_user(),
            log,
        }
    }

    /// sshd with the config in `sd`, appending to `log`, accepting on `port`.
    fn spawn(sd: &Path, port: u16, log: &Path) -> Child {
        let sshd = sshd_program();
        let out = fs::OpenOptions::new().append(true).open(log).unwrap();
        let mut child = Command::new(&sshd)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(sd.join("sshd_config"))
            .current_dir(sd)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", sshd.display()));
        wait_port(&mut child, port, "sshd", log, Duration::from_secs(20));
        child
    }

    /// Start the server again, same port, keys and config, after `stop`.
    pub fn restart(&mut self) {
        self.stop();
        self.child = Sshd::spawn(&self.dir, self.port, &self.log);
    }

    /// The ssh client options that reach this server (no destination): the
    /// port, the key and nothing else (no user or system ssh config, no
    /// agent keys, no known_hosts, no prompts, only errors on stderr).
    pub fn ssh_options(&self) -> Vec<String> {
        let mut v: Vec<String> = [
            "-F",
            "/dev/null",
            "-p",
            &self.port.to_string(),
            "-i",
            &self.key.to_string_lossy(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for o in [
            "IdentitiesOnly=yes",
            "UserKnownHostsFile=/dev/null",
            "GlobalKnownHostsFile=/dev/null",
            "StrictHostKeyChecking=no",
            "BatchMode=yes",
            "LogLevel=ERROR",
            "ConnectTimeout=20",
        ] {
            v.push("-o".into());
            v.push(o.into());
        }
        v
    }

    /// `USER@127.0.0.1`.
    pub fn destination(&self) -> String {
        format!("{}@127.0.0.1", self.user)
    }

    /// `ssh OPTIONS USER@127.0.0.1`, stdin closed: append the remote command
    /// (one string for the remote shell, or several words it joins with
    /// spaces). Its exit code is the remote command's (255: ssh failed).
    pub fn ssh(&self) -> Command {
        let mut c = Command::new("ssh");
        c.args(self.ssh_options())
            .arg(self.destination())
            .stdin(Stdio::null());
        c
    }

    /// `ssh OPTIONS` as one string, for sshfs's `ssh_command=` (which splits
    /// it on spaces).
    pub fn ssh_command(&self) -> String {
        let mut v = vec!["ssh".to_string()];
        v.extend(self.ssh_options());
        v.join(" ")
    }

    /// The arguments of `sshfs` (program name excluded) that mount
    /// `remote_path` on `mountpoint` through this server, with
    /// `sftp_server`, when non-empty, as the remote command serving SFTP on
    /// its stdin/stdout (a value with a `/` is run by the remote shell as a
    /// plain command, e.g. `/usr/lib/openssh/sftp-server` or `SHEAF run
    /// --mount IMG:/data -- /usr/lib/openssh/sftp-server`; empty means the
    /// server's `sftp` subsystem). `-f`: sshfs stays in the foreground until
    /// unmounted. Commas are escaped for FUSE's option parser.
    pub fn sshfs_args(
        &self,
        sftp_server: &str,
        remote_path: &str,
        mountpoint: &Path,
    ) -> Vec<OsString> {
        let esc = |s: &str| s.replace('\\', "\\\\").replace(',', "\\,");
        let mut v: Vec<OsString> = vec!["-f".into(), "-o".into()];
        v.push(format!("ssh_command={}", esc(&self.ssh_command())).into());
        if !sftp_server.is_empty() {
            v.push("-o".into());
            v.push(format!("sftp_server={}", esc(sftp_server)).into());
        }
        v.push(format!("{}:{remote_path}", self.destination()).into());
        v.push(mountpoint.into());
        v
    }

    /// Mount `remote_path` on `mountpoint` (created if missing) with sshfs
    /// through this server ([`sshfs_args`](Self::sshfs_args)); returns once
    /// the mount answers (sshfs mounts first and connects after, so a stat of
    /// the root waits for the remote command to serve). Panics, with sshfs's
    /// output (which has the remote command's stderr), if sshfs exits, the
    /// stat fails or 30 s pass; nothing stays mounted then. The guard
    /// unmounts it when dropped.
    pub fn sshfs(&self, sftp_server: &str, remote_path: &str, mountpoint: &Path) -> SshfsMount {
        fs::create_dir_all(mountpoint).unwrap();
        let mp = mountpoint.canonicalize().unwrap();
        let log = self.dir.join(format!(
            "sshfs-{}.log",
            mp.to_string_lossy().replace('/', "_")
        ));
        let out = fs::File::create(&log).unwrap();
        let child = Command::new("sshfs")
            .args(self.sshfs_args(sftp_server, remote_path, &mp))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("sshfs (apt-get install sshfs, or scripts/deps.sh)");
        let mut m = SshfsMount {
            child: Some(child),
            mountpoint: mp.clone(),
            log,
        };
        let fail = |m: &mut SshfsMount, why: String| -> ! {
            // Let sshfs finish writing what the remote side said, then make
            // sure nothing stays mounted.
            let st = m.child.as_mut().map(|c| {
                let t0 = Instant::now();
                loop {
                    match c.try_wait() {
                        Ok(Some(st)) => break st.to_string(),
                        Ok(None) if t0.elapsed() < Duration::from_secs(5) => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        _ => break "still running: killed".to_string(),
                    }
                }
            });
            if is_mount_point(&m.mountpoint) {
                let _ = fusermount_u(&m.mountpoint, true);
            }
            m.wait_sshfs();
            panic!(
                "sshfs {sftp_server:?} {remote_path:?} on {}: {why} (sshfs: {}); {}:\n{}\nsshd {}:\n{}",
                m.mountpoint.display(),
                st.unwrap_or_default(),
                m.log.display(),
                tail(&m.log, 30),
                self.log.display(),
                tail(&self.log, 20)
            );
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mount_point(&mp) {
            if let Ok(Some(_)) = m.child.as_mut().unwrap().try_wait() {
                fail(&mut m, "exited before mounting".into());
            }
            if Instant::now() > deadline {
                fail(&mut m, "not mounted within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // In a thread: a stat of a mount whose server hangs would block.
        let (tx, rx) = std::sync::mpsc::channel();
        let root = mp.clone();
        std::thread::spawn(move || {
            let _ = tx.send(fs::metadata(&root).map(|_| ()));
        });
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Ok(())) => m,
            Ok(Err(e)) => fail(&mut m, format!("stat of the mount's root: {e}")),
            Err(_) => fail(&mut m, "no answer to a stat within 30 s".into()),
        }
    }

    /// sshd's log so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stop the server and everything it started (see the type's doc).
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        // The listener stopped first, so that no session is forked after the
        // list below is taken (one that was survived the listener and served
        // a client that had just connected: a read meant to fail passed).
        let pid = self.child.id();
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
        let t0 = Instant::now();
        while !stopped(pid) && t0.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Then the sessions: SIGTERM lets a remote command (e.g. `sheaf run`)
        // clean up.
        let desc = descendants(pid);
        for &p in &desc {
            unsafe { libc::kill(p as libc::pid_t, libc::SIGTERM) };
        }
        let t0 = Instant::now();
        while desc.iter().any(|&p| alive(p)) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        for &p in &desc {
            if alive(p) {
                unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An sshfs mount from [`Sshd::sshfs`]: on drop, `fusermount3 -u` (lazily
/// if busy), then sshfs is waited for (killed after 10 s).
pub struct SshfsMount {
    child: Option<Child>,
    pub mountpoint: PathBuf,
    /// sshfs's stdout and stderr, with ssh's and the remote command's stderr.
    pub log: PathBuf,
}

impl SshfsMount {
    /// Unmount now; `Err` with fusermount3's message if it fails (e.g. busy),
    /// the mount then stays (drop unmounts lazily).
    pub fn unmount(&mut self) -> Result<(), String> {
        if self.child.is_none() {
            return Ok(());
        }
        fusermount_u(&self.mountpoint, false)?;
        self.wait_sshfs();
        Ok(())
    }

    /// What sshfs (and the remote command) wrote so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_sshfs(&mut self) {
        if let Some(mut c) = self.child.take() {
            let t0 = Instant::now();
            while matches!(c.try_wait(), Ok(None)) && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for SshfsMount {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        if fusermount_u(&self.mountpoint, false).is_err() {
            let _ = fusermount_u(&self.mountpoint, true);
        }
        self.wait_sshfs();
    }
}

/// `fusermount3 -u [-z] MP`.
fn fusermount_u(mp: &Path, lazy: bool) -> Result<(), String> {
    let mut c = Command::new("fusermount3");
    c.arg(if lazy { "-uz" } else { "-u" }).arg(mp);
    match c.stdin(Stdio::null()).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "fusermount3 -u {}: {}",
            mp.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("fusermount3: {e}")),
    }
}

/// Whether something is mounted at `mp` (an absolute, canonical path), by
/// /proc/self/mountinfo.
pub fn is_mount_point(mp: &Path) -> bool {
    let want = mp.to_string_lossy();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| unescape_mountinfo(m) == want)
}

fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The name of the user running the tests.
fn current_user() -> String {
    let pw = unsafe { libc::getpwuid(libc::geteuid()) };
    assert!(!pw.is_null(), "no passwd entry for uid {}", unsafe {
        libc::geteuid()
    });
    unsafe { std::ffi::CStr::from_ptr((*pw).pw_name) }
        .to_string_lossy()
        .into_owned()
}

/// The state letter of process `pid` in /proc (`R`, `S`, `T`, `Z`, …), or
/// None if there is no such process.
fn proc_state(pid: u32) -> Option<char> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name in parentheses may itself hold spaces and parentheses.
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    proc_state(pid).is_some_and(|c| c != 'Z')
}

/// Whether `pid` is stopped by a signal (state `T` in /proc).
fn stopped(pid: u32) -> bool {
    proc_state(pid) == Some('T')
}

/// Every process descended from `pid` (not `pid` itself), by /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent = Vec::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            if let Some(pp) = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1))
                .and_then(|x| x.parse::<u32>().ok())
            {
                parent.push((p, pp));
            }
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out.remove(0);
    out
}

/// A real registry (Debian's docker-registry, the CNCF distribution) on
/// 127.0.0.1, plain HTTP, no auth, its storage and access log in `dir`.
pub struct Registry {
    child: Option<Child>,
    pub port: u16,
    log: PathBuf,
    /// `user:password` when it asks for basic auth (htpasswd).
    creds: Option<String>,
}

impl Registry {
    pub fn start(dir: &Path) -> Registry {
        Registry::start_inner(dir, None)
    }

    /// The same, asking for HTTP basic auth (an htpasswd file made with
    /// Apache's htpasswd, bcrypt) of `user` with `password`.
    pub fn start_with_auth(dir: &Path, user: &str, password: &str) -> Registry {
        Registry::start_inner(dir, Some((user, password)))
    }

    fn start_inner(dir: &Path, auth: Option<(&str, &str)>) -> Registry {
        let port = free_port();
        let store = dir.join(format!("registry-{port}"));
        fs::create_dir_all(&store).unwrap();
        let cfg = dir.join(format!("registry-{port}.yml"));
        let auth_cfg = match auth {
            Some((user, password)) => {
                let o = Command::new("htpasswd")
                    .args(["-Bbn", user, password])
                    .output()
                    .unwrap_or_else(|e| panic!("htpasswd (apache2-utils): {e}"));
                assert!(o.status.success(), "htpasswd failed");
                let file = dir.join(format!("registry-{port}.htpasswd"));
                fs::write(&file, &o.stdout).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: sheaf-test\n    path: {}\n",
                    file.display()
                )
            }
            None => String::new(),
        };
        fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{auth_cfg}",
                store.display()
            ),
        )
        .unwrap();
        let log = dir.join(format!("registry-{port}.log"));
        let out = fs::File::create(&log).unwrap();
        let mut child = Command::new(program("docker-registry"))
            .arg("serve")
            .arg(&cfg)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting docker-registry: {e}"));
        wait_port(
            &mut child,
            port,
            "docker-registry",
            &log,
            Duration::from_secs(20),
        );
        Registry {
            child: Some(child),
            port,
            log,
            creds: auth.map(|(u, p)| format!("{u}:{p}")),
        }
    }

    /// `HOST:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The paths of the GET requests in the access log so far.
    pub fn gets(&self) -> Vec<String> {
        let s = fs::read_to_string(&self.log).unwrap_or_default();
        s.lines()
            .filter_map(|l| {
                let i = l.find("\"GET ")?;
                let rest = &l[i + 5..];
                Some(rest.split(' ').next()?.to_string())
            })
            .collect()
    }

    /// Push an OCI layout image (`oci:DIR:TAG`) as `REPO:TAG` with skopeo.
    pub fn push(&self, src: &str, dest: &str) {
        let mut c = Command::new("skopeo");
        c.args(["copy", "-q", "--dest-tls-verify=false", src]);
        if let Some(creds) = &self.creds {
            c.arg(format!("--dest-creds={creds}"));
        }
        let o = c
            .arg(format!("docker://{}/{dest}", self.host()))
            .output()
            .unwrap_or_else(|e| panic!("skopeo: {e}"));
        assert!(
            o.status.success(),
            "skopeo copy {src} -> {dest}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
