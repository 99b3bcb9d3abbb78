//! `sheaf find` and `sheaf du`: metadata questions answered from the image
//! itself (file or URL), no mount: a find(1) subset and du(1) totals. The
//! walk is `sheaf_read::Image::walk`; this file parses and prints.

use crate::util::RemoteArgs;
use anyhow::{bail, Context, Result};
use sheaf_format::FileType;
use sheaf_read::{Image, Inode, Step};
use std::ffi::{CString, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Arguments of `sheaf find`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Expression (find(1) syntax and meaning):\n  \
  tests    -name PAT  -iname PAT  -path PAT   (shell patterns, as find's)\n  \
           -type [fdlcbps]  -size [+-]N[cwbkMG]  -empty  -newer FILE  -mtime [+-]N  -mmin [+-]N\n  \
           -uid [+-]N  -gid [+-]N  -links [+-]N  -true  -false\n  \
  actions  -print (the default)  -print0  -printf FMT (%p %P %f %h %s %m %M %y %l %U %G %i %n %T@ %%; \\n \\t \\0)\n  \
           -prune (do not enter this directory)  -quit (stop)\n  \
  options  -maxdepth N  -mindepth N\n  \
  operators  ( EXPR )  ! EXPR  EXPR [-a] EXPR  EXPR -o EXPR  EXPR , EXPR   (quote the parentheses from the shell)\n\n\
Examples:\n  sheaf find data.sheaf / -name '*.nii.gz' -size +10M\n  \
sheaf find https://host/stack.sheaf /lib -type f -printf '%s %p\\n'\n  \
sheaf find img.sheaf /sub -maxdepth 1 -type d -print0 | xargs -0 ...\n  \
sheaf find src.sheaf \\( -name '*.c' -o -name '*.h' \\) -size +100k\n  \
sheaf find stack.sheaf -name __pycache__ -prune -o -name '*.py' -print")]
pub struct FindArgs {
    /// The image (file or URL).
    image: PathBuf,
    /// [PATH] [EXPRESSION...]: where to start in the image (default /), then
    /// the expression.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PATH] [EXPR"
    )]
    rest: Vec<OsString>,
}

/// Arguments of `sheaf du`.
#[derive(clap::Args, Debug)]
// `-h` is du's human-readable flag, as in du(1): help is `--help` only.
#[command(
    disable_help_flag = true,
    after_help = "Sizes are apparent: bytes of files and symlink targets, a hardlinked file \
counted once (directories' own sizes are not counted). --inodes counts entries instead, \
as du --inodes does: every file, directory and link, a hardlinked file once. --json gives \
both for each row.\n\nExamples:\n  sheaf du -s -h data.sheaf\n  sheaf du -d 1 img.sheaf /usr\n  \
sheaf du --inodes -d 1 hcp.sheaf /subjects   # where the millions of files are"
)]
pub struct DuArgs {
    /// The image (file or URL).
    image: PathBuf,
    /// Where to start in the image.
    #[arg(default_value = "/")]
    path: String,
    /// Only the total of PATH.
    #[arg(short, long)]
    summarize: bool,
    /// Print directories at most N levels below PATH.
    #[arg(short = 'd', long, value_name = "N")]
    max_depth: Option<usize>,
    /// Print files too, not only directories.
    #[arg(short, long)]
    all: bool,
    /// Count entries (inodes) instead of bytes.
    #[arg(long)]
    inodes: bool,
    /// Human-readable sizes (K, M, G).
    #[arg(short = 'h', long)]
    human_readable: bool,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
}

#[derive(Debug)]
enum Test {
    Name(CString, bool),
    Path(CString),
    Type(Vec<FileType>),
    /// Compare ceil(size / unit) with n: -1 less, 0 equal, 1 more.
    Size(i8, u64, u64),
    Empty,
    NewerThan(i64, u32),
    /// (sign, n, seconds per unit): age in whole units.
    Age(i8, u64, i64),
    /// A number of the inode compared with n (sign as for Size).
    Number(Field, i8, u64),
}

#[derive(Debug, Clone, Copy)]
enum Field {
    Uid,
    Gid,
    Links,
}

/// An expression in find(1)'s grammar. Operators by precedence, loosest
/// first: `,` (both evaluated, the value is the right one's), `-o`, `-a`
/// (or nothing between two terms), `!`; parentheses group.
#[derive(Debug)]
enum Node {
    Test(Test),
    Bool(bool),
    Not(Box<Node>),
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    List(Box<Node>, Box<Node>),
    /// `-print` / `-print0`: the path, then this byte.
    Print(u8),
    Printf(Vec<u8>),
    /// True; a directory's entries are not visited.
    Prune,
    /// True; the walk ends after this entry.
    Quit,
}

impl Node {
    /// Whether the expression does something itself: if not, find(1) prints
    /// every entry it is true for (`-prune` does not count).
    fn acts(&self) -> bool {
        match self {
            Node::Print(_) | Node::Printf(_) | Node::Quit => true,
            Node::Not(n) => n.acts(),
            Node::And(a, b) | Node::Or(a, b) | Node::List(a, b) => a.acts() || b.acts(),
            Node::Test(_) | Node::Bool(_) | Node::Prune => false,
        }
    }
}

struct Expr {
    root: Node,
    min_depth: usize,
    max_depth: usize,
}

fn signed(s: &str) -> (i8, &str) {
    match s.as_bytes().first() {
        Some(b'+') => (1, &s[1..]),
        Some(b'-') => (-1, &s[1..]),
        _ => (0, s),
    }
}

fn cstring(s: &OsString) -> Result<CString> {
    CString::new(s.as_bytes()).context("a pattern with a NUL byte")
}

/// A recursive-descent parser over the expression's words.
struct Parser<'a> {
    words: &'a [OsString],
    at: usize,
    min_depth: usize,
    max_depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<std::borrow::Cow<'_, str>> {
        self.words.get(self.at).map(|w| w.to_string_lossy())
    }

    fn next(&mut self) -> Option<std::borrow::Cow<'_, str>> {
        let w = self.words.get(self.at)?;
        self.at += 1;
        Some(w.to_string_lossy())
    }

    /// The argument of option `what`.
    fn arg(&mut self, what: &str) -> Result<OsString> {
        let w = self.words.get(self.at).cloned();
        self.at += 1;
        w.with_context(|| format!("{what} needs an argument"))
    }

    /// `a , b , ...`
    fn list(&mut self) -> Result<Node> {
        let mut n = self.or()?;
        while self.peek().as_deref() == Some(",") {
            self.at += 1;
            self.expect_term(",")?;
            let r = self.or()?;
            n = Node::List(Box::new(n), Box::new(r));
        }
        Ok(n)
    }

    /// `a -o b -o ...`
    fn or(&mut self) -> Result<Node> {
        let mut n = self.and()?;
        while matches!(self.peek().as_deref(), Some("-o" | "-or")) {
            let op = self.next().unwrap_or_default().into_owned();
            self.expect_term(&op)?;
            let r = self.and()?;
            n = Node::Or(Box::new(n), Box::new(r));
        }
        Ok(n)
    }

    /// A binary operator must be followed by a term.
    fn expect_term(&self, op: &str) -> Result<()> {
        match self.peek().as_deref() {
            None | Some(")" | "-o" | "-or" | "," | "-a" | "-and") => {
                bail!("find expression: '{op}' needs an expression after it")
            }
            _ => Ok(()),
        }
    }

    /// `a -a b`, `a b`
    fn and(&mut self) -> Result<Node> {
        let mut n = self.unary()?;
        loop {
            match self.peek().as_deref() {
                None | Some(")" | "-o" | "-or" | ",") => return Ok(n),
                Some("-a" | "-and") => {
                    let op = self.next().unwrap_or_default().into_owned();
                    self.expect_term(&op)?;
                }
                Some(_) => {}
            }
            let r = self.unary()?;
            n = Node::And(Box::new(n), Box::new(r));
        }
    }

    /// `! a`, `( a )`, or a primary.
    fn unary(&mut self) -> Result<Node> {
        let Some(w) = self.next().map(|w| w.into_owned()) else {
            bail!("find expression: ends where a test was expected")
        };
        match w.as_str() {
            "!" | "-not" => {
                self.expect_term(&w)?;
                Ok(Node::Not(Box::new(self.unary()?)))
            }
            "(" => {
                if self.peek().as_deref() == Some(")") {
                    bail!("find expression: empty parentheses")
                }
                let n = self.list()?;
                match self.next().as_deref() {
                    Some(")") => Ok(n),
                    _ => bail!("find expression: '(' without a matching ')'"),
                }
            }
            ")" => bail!("find expression: ')' without a matching '('"),
            "-o" | "-or" | "-a" | "-and" | "," => {
                bail!("find expression: '{w}' with nothing before it")
            }
            _ => self.primary(&w),
        }
    }

    fn primary(&mut self, t: &str) -> Result<Node> {
        let test = match t {
            "-true" => return Ok(Node::Bool(true)),
            "-false" => return Ok(Node::Bool(false)),
            "-print" => return Ok(Node::Print(b'\n')),
            "-print0" => return Ok(Node::Print(0)),
            "-printf" => return Ok(Node::Printf(self.arg("-printf")?.as_bytes().to_vec())),
            "-prune" => return Ok(Node::Prune),
            "-quit" => return Ok(Node::Quit),
            // Options, not tests (find(1) takes them anywhere): true.
            "-maxdepth" | "-mindepth" => {
                let v = self.arg(t)?.to_string_lossy().into_owned();
                let n = v
                    .parse()
                    .with_context(|| format!("{t} {v}: not a number"))?;
                if t == "-maxdepth" {
                    self.max_depth = n;
                } else {
                    self.min_depth = n;
                }
                return Ok(Node::Bool(true));
            }
            "-name" => Test::Name(cstring(&self.arg(t)?)?, false),
            "-iname" => Test::Name(cstring(&self.arg(t)?)?, true),
            "-path" | "-wholename" => Test::Path(cstring(&self.arg(t)?)?),
            "-type" => {
                let v = self.arg(t)?;
                let mut types = Vec::new();
                for c in v.to_string_lossy().split(',') {
                    types.push(match c {
                        "f" => FileType::Regular,
                        "d" => FileType::Directory,
                        "l" => FileType::Symlink,
                        "c" => FileType::CharDevice,
                        "b" => FileType::BlockDevice,
                        "p" => FileType::Fifo,
                        "s" => FileType::Socket,
                        _ => bail!("-type {c}: one of f d l c b p s"),
                    });
                }
                Test::Type(types)
            }
            "-size" => {
                let v = self.arg(t)?.to_string_lossy().into_owned();
                let (sign, rest) = signed(&v);
                let (num, unit) = match rest.char_indices().last() {
                    Some((i, c)) if c.is_ascii_alphabetic() => (&rest[..i], c),
                    _ => (rest, 'b'),
                };
                let unit = match unit {
                    'c' => 1,
                    'w' => 2,
                    'b' => 512,
                    'k' => 1 << 10,
                    'M' => 1 << 20,
                    'G' => 1 << 30,
                    _ => bail!("-size {v}: unit one of c w b k M G"),
                };
                let n = num
                    .parse()
                    .with_context(|| format!("-size {v}: not a number"))?;
                Test::Size(sign, n, unit)
            }
            "-empty" => Test::Empty,
            "-newer" => {
                let f = self.arg(t)?;
                let md = std::fs::metadata(&f)
                    .with_context(|| format!("-newer {}", f.to_string_lossy()))?;
                use std::os::unix::fs::MetadataExt;
                Test::NewerThan(md.mtime(), md.mtime_nsec() as u32)
            }
            "-mtime" | "-mmin" | "-uid" | "-gid" | "-links" => {
                let v = self.arg(t)?.to_string_lossy().into_owned();
                let (sign, rest) = signed(&v);
                let n = rest
                    .parse()
                    .with_context(|| format!("{t} {v}: not a number"))?;
                match t {
                    "-mtime" => Test::Age(sign, n, 86_400),
                    "-mmin" => Test::Age(sign, n, 60),
                    "-uid" => Test::Number(Field::Uid, sign, n),
                    "-gid" => Test::Number(Field::Gid, sign, n),
                    _ => Test::Number(Field::Links, sign, n),
                }
            }
            other => {
                bail!("unknown or unsupported find expression '{other}' (see sheaf find --help)")
            }
        };
        Ok(Node::Test(test))
    }
}

fn parse_expr(words: &[OsString]) -> Result<Expr> {
    let mut p = Parser {
        words,
        at: 0,
        min_depth: 0,
        max_depth: usize::MAX,
    };
    let mut root = if words.is_empty() {
        Node::Bool(true)
    } else {
        p.list()?
    };
    if p.at < words.len() {
        // Only a ')' stops the top level before the end.
        bail!("find expression: ')' without a matching '('")
    }
    if !root.acts() {
        root = Node::And(Box::new(root), Box::new(Node::Print(b'\n')));
    }
    Ok(Expr {
        root,
        min_depth: p.min_depth,
        max_depth: p.max_depth,
    })
}

fn fnmatch(pat: &CString, s: &[u8], fold: bool) -> bool {
    let Ok(s) = CString::new(s) else { return false };
    let flags = if fold { libc::FNM_CASEFOLD } else { 0 };
    // SAFETY: two NUL-terminated strings.
    unsafe { libc::fnmatch(pat.as_ptr(), s.as_ptr(), flags) == 0 }
}

fn base(path: &[u8]) -> &[u8] {
    if path == b"/" {
        return path;
    }
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

fn now() -> (i64, u32) {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos())
}

/// find's `[+-]N`: more than (`+`), less than (`-`) or exactly N.
fn compare<T: Ord>(v: T, sign: i8, n: T) -> bool {
    v.cmp(&n) == sign.cmp(&0)
}

fn matches(t: &Test, img: &Image, path: &[u8], ino: &Inode, now: i64) -> Result<bool> {
    let r = &ino.rec;
    Ok(match t {
        Test::Name(p, fold) => fnmatch(p, base(path), *fold),
        Test::Path(p) => fnmatch(p, path, false),
        Test::Type(ts) => ts.contains(&ino.file_type()),
        Test::Size(sign, n, unit) => compare(r.size.div_ceil(*unit), *sign, *n),
        Test::Empty => match ino.file_type() {
            FileType::Regular => r.size == 0,
            FileType::Directory => img.dir_len(ino)? == 0,
            _ => false,
        },
        Test::NewerThan(s, ns) => (r.mtime_sec, r.mtime_nsec) > (*s, *ns),
        Test::Age(sign, n, unit) => {
            // find: the age in whole units, rounded down.
            let age = (now - r.mtime_sec).div_euclid(*unit);
            compare(age, *sign, *n as i64)
        }
        Test::Number(f, sign, n) => {
            let v = match f {
                Field::Uid => r.uid as u64,
                Field::Gid => r.gid as u64,
                Field::Links => r.nlink as u64,
            };
            compare(v, *sign, *n)
        }
    })
}

fn type_letter(t: FileType) -> u8 {
    match t {
        FileType::Regular => b'f',
        FileType::Directory => b'd',
        FileType::Symlink => b'l',
        FileType::CharDevice => b'c',
        FileType::BlockDevice => b'b',
        FileType::Fifo => b'p',
        FileType::Socket => b's',
    }
}

fn printf(
    o: &mut impl Write,
    fmt: &[u8],
    img: &Image,
    start: &[u8],
    path: &[u8],
    ino: &Inode,
) -> Result<()> {
    let r = &ino.rec;
    let mut i = 0;
    while i < fmt.len() {
        let c = fmt[i];
        let next = fmt.get(i + 1).copied();
        match (c, next) {
            (b'\\', Some(e)) => {
                o.write_all(match e {
                    b'n' => b"\n",
                    b't' => b"\t",
                    b'0' => b"\0",
                    b'\\' => b"\\",
                    _ => &fmt[i..i + 2],
                })?;
                i += 2;
            }
            (b'%', Some(f)) => {
                let mut step = 2;
                match f {
                    b'%' => o.write_all(b"%")?,
                    b'p' => o.write_all(path)?,
                    b'P' => {
                        let rel = path.strip_prefix(start).unwrap_or(path);
                        o.write_all(rel.strip_prefix(b"/").unwrap_or(rel))?
                    }
                    b'f' => o.write_all(base(path))?,
                    b'h' => {
                        let d = match path.iter().rposition(|&b| b == b'/') {
                            Some(0) => &b"/"[..],
                            Some(k) => &path[..k],
                            None => &b"."[..],
                        };
                        o.write_all(d)?
                    }
                    b's' => write!(o, "{}", r.size)?,
                    b'm' => write!(o, "{:o}", r.mode & 0o7777)?,
                    b'M' => write!(o, "{}", crate::inspect::mode_string(r.mode))?,
                    b'y' => o.write_all(&[type_letter(ino.file_type())])?,
                    b'l' => {
                        if ino.file_type() == FileType::Symlink {
                            o.write_all(&img.read_link(ino)?)?
                        }
                    }
                    b'U' => write!(o, "{}", r.uid)?,
                    b'G' => write!(o, "{}", r.gid)?,
                    b'i' => write!(o, "{}", ino.ino)?,
                    b'n' => write!(o, "{}", r.nlink)?,
                    b'T' if fmt.get(i + 2) == Some(&b'@') => {
                        write!(o, "{}.{:09}0", r.mtime_sec, r.mtime_nsec)?;
                        step = 3;
                    }
                    _ => bail!(
                        "-printf: %{} is not supported (see sheaf find --help)",
                        f as char
                    ),
                }
                i += step;
            }
            _ => {
                o.write_all(&[c])?;
                i += 1;
            }
        }
    }
    Ok(())
}

/// Split `rest` into the start path and the expression.
fn split_rest(rest: &[OsString]) -> (String, &[OsString]) {
    match rest.first() {
        Some(p) if p.as_bytes().starts_with(b"/") => (p.to_string_lossy().into_owned(), &rest[1..]),
        _ => ("/".to_string(), rest),
    }
}

/// Normalise an image path: absolute, no trailing slash (but "/").
fn start_path(p: &str) -> Vec<u8> {
    let t = p.trim_end_matches('/');
    if t.is_empty() {
        b"/".to_vec()
    } else {
        t.as_bytes().to_vec()
    }
}

/// `sheaf find`.
pub fn find(a: FindArgs, remote: &RemoteArgs) -> Result<i32> {
    let (path, tokens) = split_rest(&a.rest);
    let e = parse_expr(tokens)?;
    let img = crate::util::open_image(&a.image, remote)?;
    let start = start_path(&path);
    // The error names the path (and the image, where the image is at fault).
    let ino = img.resolve(&start)?;
    let (now_s, _) = now();
    let mut ev = Eval {
        img: &img,
        start: &start,
        now: now_s,
        out: std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock()),
        prune: false,
        quit: false,
    };
    let mut out_err: Option<anyhow::Error> = None;
    img.walk(ino, start.clone(), &mut |p, ino, depth| {
        ev.prune = false;
        if depth >= e.min_depth && depth <= e.max_depth {
            if let Err(err) = ev.eval(&e.root, p, ino) {
                // A closed pipe (`| head`) or a damaged entry: stop here.
                out_err.get_or_insert(err);
                return Ok(Step::Stop);
            }
        }
        Ok(if ev.quit {
            Step::Stop
        } else if ev.prune || depth >= e.max_depth {
            Step::Prune
        } else {
            Step::Continue
        })
    })
    .with_context(|| a.image.display().to_string())?;
    if let Some(err) = out_err {
        return Err(err);
    }
    ev.out.flush()?;
    Ok(0)
}

/// Evaluates the expression on one entry at a time, printing as it goes.
struct Eval<'a, W: Write> {
    img: &'a Image,
    start: &'a [u8],
    now: i64,
    out: W,
    /// Set by `-prune` on this entry.
    prune: bool,
    /// Set by `-quit`.
    quit: bool,
}

impl<W: Write> Eval<'_, W> {
    fn eval(&mut self, n: &Node, path: &[u8], ino: &Inode) -> Result<bool> {
        Ok(match n {
            Node::Test(t) => matches(t, self.img, path, ino, self.now)?,
            Node::Bool(b) => *b,
            Node::Not(a) => !self.eval(a, path, ino)?,
            Node::And(a, b) => self.eval(a, path, ino)? && self.eval(b, path, ino)?,
            Node::Or(a, b) => self.eval(a, path, ino)? || self.eval(b, path, ino)?,
            Node::List(a, b) => {
                self.eval(a, path, ino)?;
                self.eval(b, path, ino)?
            }
            Node::Print(end) => {
                self.out.write_all(path)?;
                self.out.write_all(&[*end])?;
                true
            }
            Node::Printf(f) => {
                printf(&mut self.out, f, self.img, self.start, path, ino)?;
                true
            }
            Node::Prune => {
                self.prune = true;
                true
            }
            Node::Quit => {
                self.quit = true;
                true
            }
        })
    }
}

/// What `sheaf du` adds up under a directory.
#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    bytes: u64,
    inodes: u64,
}

impl Usage {
    fn add(&mut self, o: Usage) {
        self.bytes += o.bytes;
        self.inodes += o.inodes;
    }
}

/// `sheaf du`.
pub fn du(a: DuArgs, remote: &RemoteArgs) -> Result<i32> {
    let img = crate::util::open_image(&a.image, remote)?;
    let start = start_path(&a.path);
    let ino = img.resolve(&start)?;
    let show_depth = if a.summarize {
        0
    } else {
        a.max_depth.unwrap_or(usize::MAX)
    };
    // Directories open on the walk's path, with their totals so far.
    let mut open: Vec<(Vec<u8>, usize, Usage)> = Vec::new();
    let mut rows: Vec<(Vec<u8>, Usage)> = Vec::new();
    let mut linked = std::collections::HashSet::new();
    let close =
        |open: &mut Vec<(Vec<u8>, usize, Usage)>, rows: &mut Vec<(Vec<u8>, Usage)>, to: usize| {
            while open.last().is_some_and(|d| d.1 >= to) {
                let (p, depth, total) = open.pop().expect("checked");
                if let Some(parent) = open.last_mut() {
                    parent.2.add(total);
                }
                if depth <= show_depth {
                    rows.push((p, total));
                }
            }
        };
    img.walk(ino, start, &mut |p, ino, depth| {
        close(&mut open, &mut rows, depth);
        let ft = ino.file_type();
        // A hardlinked file counts once, where the walk meets it first.
        let again = ft == FileType::Regular && ino.rec.nlink > 1 && !linked.insert(ino.ino);
        let own = match ft {
            _ if again => Usage::default(),
            FileType::Regular | FileType::Symlink => Usage {
                bytes: ino.rec.size,
                inodes: 1,
            },
            _ => Usage {
                bytes: 0,
                inodes: 1,
            },
        };
        if ft == FileType::Directory {
            open.push((p.to_vec(), depth, own));
        } else {
            if let Some(d) = open.last_mut() {
                d.2.add(own);
            }
            // PATH names a file (its own row), or -a.
            if open.is_empty() || (a.all && depth <= show_depth && !again) {
                rows.push((p.to_vec(), own));
            }
        }
        Ok(Step::Continue)
    })
    .with_context(|| a.image.display().to_string())?;
    close(&mut open, &mut rows, 0);
    let mut o = std::io::BufWriter::new(std::io::stdout().lock());
    if a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(p, u)| {
                serde_json::json!({"path": String::from_utf8_lossy(p), "bytes": u.bytes, "inodes": u.inodes})
            })
            .collect();
        writeln!(o, "{}", serde_json::Value::Array(v))?;
    } else {
        for (p, u) in rows {
            let size = match (a.inodes, a.human_readable) {
                (true, _) => u.inodes.to_string(),
                (false, true) => crate::util::human(u.bytes),
                (false, false) => u.bytes.to_string(),
            };
            write!(o, "{size}\t")?;
            o.write_all(&p)?;
            o.write_all(b"\n")?;
        }
    }
    o.flush()?;
    Ok(0)
}
