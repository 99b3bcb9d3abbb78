//! find(1)'s language over an image: the engine of `sheaf find` and the
//! Python package's `Image.find`. [`parse`] reads an expression (tests,
//! actions, operators, options as find(1) has them), [`run`] walks the
//! image from a start path (`Image::walk_in`) and writes what the actions
//! print. Owner and group names come from this machine ([`crate::ident`]),
//! as find(1) shows them.

use crate::error::ReadError;
use crate::image::{Image, Inode};
use crate::show::time_field;
pub use crate::show::{local_time, mode_string, name_or_id};
use crate::stack::{Found, MergedDir, Stack};
use crate::walk::{Order, Step};
use sheaf_format::FileType;
use std::ffi::{CString, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;

/// Why an expression could not be parsed, or a find failed.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    /// The expression is wrong (one line saying where).
    #[error("{0}")]
    Expr(String),
    /// The walk could not go on: the image is damaged or unreadable.
    #[error(transparent)]
    Walk(ReadError),
    /// An entry's attributes could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Writing the output failed (e.g. a closed pipe).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

type Result<T> = std::result::Result<T, FindError>;

macro_rules! bail {
    ($($t:tt)*) => { return Err(FindError::Expr(format!($($t)*))) };
}

fn expr_err(what: String, cause: impl std::fmt::Display) -> FindError {
    FindError::Expr(format!("{what}: {cause}"))
}

#[derive(Debug)]
enum Test {
    /// Pattern, whether case is ignored (the same for the next two).
    Name(CString, bool),
    Path(CString, bool),
    /// A symlink's target.
    LinkName(CString, bool),
    Type(Vec<FileType>),
    /// Compare ceil(size / unit) with n: -1 less, 0 equal, 1 more.
    Size(i8, u64, u64),
    Empty,
    NewerThan(i64, u32),
    /// (sign, n, seconds per unit): age in whole units.
    Age(i8, u64, i64),
    /// A number of the inode compared with n (sign as for Size).
    Number(Field, i8, u64),
    /// Permission bits against a mode.
    Perm(PermMatch, u32),
    /// An owner (uid) or group (gid) this machine has no name for.
    Unnamed(Field),
}

/// How `-perm` compares.
#[derive(Debug, Clone, Copy)]
enum PermMatch {
    /// `-perm MODE`: exactly these bits.
    Exact,
    /// `-perm -MODE`: all of them (and maybe more).
    All,
    /// `-perm /MODE`: any of them (or MODE is 0).
    Any,
}

#[derive(Debug, Clone, Copy)]
enum Field {
    Uid,
    Gid,
    Links,
    Inode,
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
    /// `-ls`: a line as `ls -dils` writes it.
    Ls,
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
            Node::Print(_) | Node::Printf(_) | Node::Ls | Node::Quit => true,
            Node::Not(n) => n.acts(),
            Node::And(a, b) | Node::Or(a, b) | Node::List(a, b) => a.acts() || b.acts(),
            Node::Test(_) | Node::Bool(_) | Node::Prune => false,
        }
    }
}

/// A parsed expression ([`parse`]).
#[derive(Debug)]
pub struct Expr {
    root: Node,
    min_depth: usize,
    max_depth: usize,
    /// `-depth`: a directory after its entries.
    depth_first: bool,
}

fn signed(s: &str) -> (i8, &str) {
    match s.as_bytes().first() {
        Some(b'+') => (1, &s[1..]),
        Some(b'-') => (-1, &s[1..]),
        _ => (0, s),
    }
}

fn cstring(s: &OsString) -> Result<CString> {
    CString::new(s.as_bytes()).map_err(|c| expr_err("a pattern with a NUL byte".into(), c))
}

/// A recursive-descent parser over the expression's words.
struct Parser<'a> {
    words: &'a [OsString],
    at: usize,
    min_depth: usize,
    max_depth: usize,
    depth_first: bool,
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
        w.ok_or_else(|| FindError::Expr(format!("{what} needs an argument")))
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
            "-ls" => return Ok(Node::Ls),
            "-prune" => return Ok(Node::Prune),
            "-depth" | "-d" => {
                self.depth_first = true;
                return Ok(Node::Bool(true));
            }
            "-quit" => return Ok(Node::Quit),
            // Options, not tests (find(1) takes them anywhere): true.
            "-maxdepth" | "-mindepth" => {
                let v = self.arg(t)?.to_string_lossy().into_owned();
                let n = v
                    .parse()
                    .map_err(|c| expr_err(format!("{t} {v}: not a number"), c))?;
                if t == "-maxdepth" {
                    self.max_depth = n;
                } else {
                    self.min_depth = n;
                }
                return Ok(Node::Bool(true));
            }
            "-name" => Test::Name(cstring(&self.arg(t)?)?, false),
            "-iname" => Test::Name(cstring(&self.arg(t)?)?, true),
            "-path" | "-wholename" => Test::Path(cstring(&self.arg(t)?)?, false),
            "-ipath" | "-iwholename" => Test::Path(cstring(&self.arg(t)?)?, true),
            "-lname" => Test::LinkName(cstring(&self.arg(t)?)?, false),
            "-ilname" => Test::LinkName(cstring(&self.arg(t)?)?, true),
            "-perm" => {
                let v = self.arg(t)?.to_string_lossy().into_owned();
                let (how, m) = parse_perm(&v).map_err(|c| expr_err(format!("-perm {v}"), c))?;
                Test::Perm(how, m)
            }
            "-user" | "-group" => {
                let v = self.arg(t)?.to_string_lossy().into_owned();
                let (field, known) = if t == "-user" {
                    (Field::Uid, crate::ident::uid_of(&v))
                } else {
                    (Field::Gid, crate::ident::gid_of(&v))
                };
                // find(1): a name this machine knows, else a number.
                let id = match known.or_else(|| v.parse().ok()) {
                    Some(id) => id,
                    None => bail!("{t} {v}: no such {} on this machine", &t[1..]),
                };
                Test::Number(field, 0, id as u64)
            }
            "-nouser" => Test::Unnamed(Field::Uid),
            "-nogroup" => Test::Unnamed(Field::Gid),
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
                    .map_err(|c| expr_err(format!("-size {v}: not a number"), c))?;
                Test::Size(sign, n, unit)
            }
            "-empty" => Test::Empty,
            // An image keeps one time, the mtime: it stands for atime and
            // ctime too, as in a mount.
            "-newer" | "-anewer" | "-cnewer" => {
                let f = self.arg(t)?;
                let md = std::fs::metadata(&f)
                    .map_err(|c| expr_err(format!("{t} {}", f.to_string_lossy()), c))?;
                use std::os::unix::fs::MetadataExt;
                Test::NewerThan(md.mtime(), md.mtime_nsec() as u32)
            }
            "-mtime" | "-atime" | "-ctime" | "-mmin" | "-amin" | "-cmin" | "-uid" | "-gid"
            | "-links" | "-inum" => {
                let v = self.arg(t)?.to_string_lossy().into_owned();
                let (sign, rest) = signed(&v);
                let n = rest
                    .parse()
                    .map_err(|c| expr_err(format!("{t} {v}: not a number"), c))?;
                match t {
                    "-mtime" | "-atime" | "-ctime" => Test::Age(sign, n, 86_400),
                    "-mmin" | "-amin" | "-cmin" => Test::Age(sign, n, 60),
                    "-uid" => Test::Number(Field::Uid, sign, n),
                    "-gid" => Test::Number(Field::Gid, sign, n),
                    "-inum" => Test::Number(Field::Inode, sign, n),
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

/// Parse find(1)'s expression (the words after the start path); with no
/// action, `-print` is added as find(1) does.
pub fn parse(words: &[OsString]) -> Result<Expr> {
    let mut p = Parser {
        words,
        at: 0,
        min_depth: 0,
        max_depth: usize::MAX,
        depth_first: false,
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
        depth_first: p.depth_first,
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

/// Now, in seconds and nanoseconds since the epoch.
pub fn now() -> (i64, u32) {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos())
}

/// find's `[+-]N`: more than (`+`), less than (`-`) or exactly N.
fn compare<T: Ord>(v: T, sign: i8, n: T) -> bool {
    v.cmp(&n) == sign.cmp(&0)
}

/// `-perm`'s argument: octal, or symbolic as chmod(1) takes it (applied
/// to no bits, a umask of 0), after `-` (all of) or `/` (any of).
fn parse_perm(v: &str) -> Result<(PermMatch, u32)> {
    let (how, m) = match v.as_bytes().first() {
        Some(b'-') => (PermMatch::All, &v[1..]),
        Some(b'/') => (PermMatch::Any, &v[1..]),
        _ => (PermMatch::Exact, v),
    };
    if !m.is_empty() && m.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        let n = u32::from_str_radix(m, 8).map_err(|c| expr_err("not a mode".into(), c))?;
        if n > 0o7777 {
            bail!("an octal mode is at most 7777");
        }
        return Ok((how, n));
    }
    let mut mode = 0u32;
    for clause in m.split(',') {
        let b = clause.as_bytes();
        let mut i = 0;
        let mut who = 0;
        while let Some(w) = b.get(i).and_then(|c| match c {
            b'u' => Some(0o4700),
            b'g' => Some(0o2070),
            b'o' => Some(0o1007),
            b'a' => Some(0o7777),
            _ => None,
        }) {
            who |= w;
            i += 1;
        }
        if who == 0 {
            who = 0o7777;
        }
        if i == b.len() {
            bail!("not a mode (octal, or symbolic such as u+x,g=r)");
        }
        while i < b.len() {
            let op = b[i];
            if !b"+-=".contains(&op) {
                bail!("'{}' where + - or = was expected", op as char);
            }
            i += 1;
            let mut bits = 0;
            while let Some(&c) = b.get(i).filter(|c| !b"+-=".contains(c)) {
                bits |= match c {
                    b'r' => 0o444,
                    b'w' => 0o222,
                    b'x' => 0o111,
                    // Execute only where some execute bit is set already:
                    // of no bits, none (as find(1) has it).
                    b'X' => 0,
                    b's' => 0o6000,
                    b't' => 0o1000,
                    _ => bail!("'{}' is not a permission (r w x X s t)", c as char),
                };
                i += 1;
            }
            let bits = bits & who;
            match op {
                b'+' => mode |= bits,
                b'-' => mode &= !bits,
                _ => mode = (mode & !who) | bits,
            }
        }
    }
    Ok((how, mode))
}

fn matches(
    t: &Test,
    img: &Image,
    names: &mut crate::ident::Names,
    merged: Option<&(&Stack, MergedDir)>,
    path: &[u8],
    ino: &Inode,
    now: i64,
) -> Result<bool> {
    let r = &ino.rec;
    Ok(match t {
        Test::Name(p, fold) => fnmatch(p, base(path), *fold),
        Test::Path(p, fold) => fnmatch(p, path, *fold),
        Test::LinkName(p, fold) => {
            ino.file_type() == FileType::Symlink && fnmatch(p, &img.read_link(ino)?, *fold)
        }
        Test::Perm(how, m) => {
            let bits = r.mode & 0o7777;
            match how {
                PermMatch::Exact => bits == *m,
                PermMatch::All => bits & m == *m,
                PermMatch::Any => *m == 0 || bits & m != 0,
            }
        }
        Test::Unnamed(f) => match f {
            Field::Uid => names.user(r.uid).is_none(),
            _ => names.group(r.gid).is_none(),
        },
        Test::Type(ts) => ts.contains(&ino.file_type()),
        Test::Size(sign, n, unit) => compare(ino.stat_size().div_ceil(*unit), *sign, *n),
        Test::Empty => match ino.file_type() {
            FileType::Regular => r.size == 0,
            // A merged directory is empty when nothing shows through it.
            FileType::Directory => match merged {
                Some((stack, d)) => stack.read_dir(d)?.is_empty(),
                None => img.dir_len(ino)? == 0,
            },
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
                Field::Inode => ino.ino as u64,
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

/// Split `rest` into the start path and the expression: as find(1), the
/// start is the first word unless it begins the expression (`-…`, `(`,
/// `)`, `!`, `,`); relative to the image's root and printed as given
/// (`sheaf find IMG usr/bin` prints `usr/bin/...`).
pub fn split_args(rest: &[OsString]) -> (String, &[OsString]) {
    match rest.first() {
        Some(p)
            if !p.is_empty()
                && !p.as_bytes().starts_with(b"-")
                && !matches!(p.as_bytes(), b"(" | b")" | b"!" | b",") =>
        {
            (p.to_string_lossy().into_owned(), &rest[1..])
        }
        _ => ("/".to_string(), rest),
    }
}

/// Normalise a start path: no trailing slash (but "/").
pub fn start_path(p: &str) -> Vec<u8> {
    let t = p.trim_end_matches('/');
    if t.is_empty() {
        b"/".to_vec()
    } else {
        t.as_bytes().to_vec()
    }
}

/// find's 1 KiB blocks (`%k`, `-ls`), of the 512-byte ones stat(2) shows.
fn kib(ino: &Inode) -> u64 {
    ino.stat_blocks().div_ceil(2)
}

/// Evaluates the expression on one entry at a time, printing as it goes.
struct Eval<'a, W: Write> {
    ctx: Ctx<'a>,
    now: i64,
    out: W,
    /// Whether `out` is a terminal: `-print` and `-ls` then quote names as
    /// ls does (an image's names may hold escape sequences).
    tty: bool,
    /// How names are quoted on a terminal.
    quote: Option<fn(&[u8]) -> String>,
    /// One `-printf` directive's text, before its padding.
    scratch: Vec<u8>,
    /// Set by `-prune` on this entry.
    prune: bool,
    /// Set by `-quit`.
    quit: bool,
}

impl<W: Write> Eval<'_, W> {
    fn eval(&mut self, n: &Node, path: &[u8], ino: &Inode, depth: usize) -> Result<bool> {
        Ok(match n {
            Node::Test(t) => matches(
                t,
                self.ctx.img,
                &mut self.ctx.names,
                self.ctx.merged.as_ref(),
                path,
                ino,
                self.now,
            )?,
            Node::Bool(b) => *b,
            Node::Not(a) => !self.eval(a, path, ino, depth)?,
            Node::And(a, b) => self.eval(a, path, ino, depth)? && self.eval(b, path, ino, depth)?,
            Node::Or(a, b) => self.eval(a, path, ino, depth)? || self.eval(b, path, ino, depth)?,
            Node::List(a, b) => {
                self.eval(a, path, ino, depth)?;
                self.eval(b, path, ino, depth)?
            }
            Node::Print(b'\n') if self.tty => {
                writeln!(self.out, "{}", (self.quote.expect("set with tty"))(path))?;
                true
            }
            Node::Print(end) => {
                self.out.write_all(path)?;
                self.out.write_all(&[*end])?;
                true
            }
            Node::Printf(f) => {
                self.printf(f, path, ino, depth)?;
                true
            }
            Node::Ls => {
                self.ls(path, ino)?;
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

    /// `-ls`: inode, KiB, mode, links, owner, group, size, mtime (the year
    /// instead of the clock beyond six months), path, `-> target`.
    fn ls(&mut self, path: &[u8], ino: &Inode) -> Result<()> {
        let r = &ino.rec;
        let (user, group) = (self.ctx.user(r.uid), self.ctx.group(r.gid));
        let size = match ino.file_type() {
            FileType::CharDevice | FileType::BlockDevice => {
                format!("{:>3}, {:>3}", libc::major(r.data), libc::minor(r.data))
            }
            _ => ino.stat_size().to_string(),
        };
        // ls(1)'s rule: recent if within the past half Gregorian year.
        let recent = (self.now - 31_556_952 / 2..=self.now).contains(&r.mtime_sec);
        let when = local_time(
            r.mtime_sec,
            if recent { "%b %e %H:%M" } else { "%b %e  %Y" },
        );
        write!(
            self.out,
            "{:>9} {:>6} {} {:>3} {:<8} {:<8} {:>8} {} ",
            ino.ino,
            kib(ino),
            mode_string(r.mode),
            r.nlink,
            user,
            group,
            size,
            when
        )?;
        let target = match ino.file_type() {
            FileType::Symlink => Some(self.ctx.img.read_link(ino)?),
            _ => None,
        };
        if self.tty {
            write!(self.out, "{}", (self.quote.expect("set with tty"))(path))?;
            if let Some(t) = target {
                write!(self.out, " -> {}", (self.quote.expect("set with tty"))(&t))?;
            }
        } else {
            self.out.write_all(path)?;
            if let Some(t) = target {
                self.out.write_all(b" -> ")?;
                self.out.write_all(&t)?;
            }
        }
        self.out.write_all(b"\n")?;
        Ok(())
    }

    fn printf(&mut self, fmt: &[u8], path: &[u8], ino: &Inode, depth: usize) -> Result<()> {
        let mut i = 0;
        while i < fmt.len() {
            let c = fmt[i];
            let next = fmt.get(i + 1).copied();
            match (c, next) {
                (b'\\', Some(e)) => {
                    self.out.write_all(match e {
                        b'n' => b"\n",
                        b't' => b"\t",
                        b'0' => b"\0",
                        b'\\' => b"\\",
                        _ => &fmt[i..i + 2],
                    })?;
                    i += 2;
                }
                (b'%', Some(f)) if !b"-+ #0123456789.".contains(&f) => {
                    // No flags, width or precision: straight out.
                    let next = fmt.get(i + 2).copied();
                    let used = self
                        .ctx
                        .directive(&mut self.out, f, next, path, ino, depth)?;
                    i += 2 + usize::from(used);
                }
                (b'%', Some(_)) => {
                    // printf(3)'s flags, width and precision, as find(1)
                    // takes them: %-20p, %10s, %.5f. find pads numbers with
                    // spaces too (it formats them as strings), so of the
                    // flags only '-' does anything.
                    let mut j = i + 1;
                    let mut left = false;
                    while let Some(&g) = fmt.get(j).filter(|g| b"-+ #0".contains(g)) {
                        left |= g == b'-';
                        j += 1;
                    }
                    let digits = |j: &mut usize| {
                        let from = *j;
                        while fmt.get(*j).is_some_and(u8::is_ascii_digit) {
                            *j += 1;
                        }
                        std::str::from_utf8(&fmt[from..*j])
                            .ok()?
                            .parse::<usize>()
                            .ok()
                    };
                    let width = digits(&mut j).unwrap_or(0);
                    let precision = if fmt.get(j) == Some(&b'.') {
                        j += 1;
                        Some(digits(&mut j).unwrap_or(0))
                    } else {
                        None
                    };
                    let Some(&f) = fmt.get(j) else {
                        bail!("-printf: the format ends inside a % directive")
                    };
                    let next = fmt.get(j + 1).copied();
                    let mut v = std::mem::take(&mut self.scratch);
                    v.clear();
                    let used = self.ctx.directive(&mut v, f, next, path, ino, depth)?;
                    if let Some(p) = precision {
                        v.truncate(p);
                    }
                    let pad = width.saturating_sub(v.len());
                    if !left {
                        write!(self.out, "{:pad$}", "")?;
                    }
                    self.out.write_all(&v)?;
                    if left {
                        write!(self.out, "{:pad$}", "")?;
                    }
                    self.scratch = v;
                    i = j + 1 + usize::from(used);
                }
                _ => {
                    self.out.write_all(&[c])?;
                    i += 1;
                }
            }
        }
        Ok(())
    }
}

/// What `-printf` and `-ls` read besides the entry: the image, the start
/// path, and the names of owners.
struct Ctx<'a> {
    /// The image of the entry being evaluated (in a stack, its layer's).
    img: &'a Image,
    /// In a stack, the entry's merged directory, when it is one.
    merged: Option<(&'a Stack, MergedDir)>,
    start: &'a [u8],
    names: crate::ident::Names,
    /// How `-printf` quotes names: set when the output is a terminal.
    quote: Option<fn(&[u8]) -> String>,
}

impl Ctx<'_> {
    fn user(&mut self, uid: u32) -> String {
        name_or_id(self.names.user(uid), uid)
    }

    fn group(&mut self, gid: u32) -> String {
        name_or_id(self.names.group(gid), gid)
    }

    /// One `-printf` directive `f` (`next` is the byte after it) into `v`;
    /// whether `next` was part of it (`%Tk`).
    /// A name (or path) from the image in `-printf` output: raw, or quoted
    /// when the output is a terminal, as `-print` does.
    fn name_to(&self, v: &mut impl Write, name: &[u8]) -> std::io::Result<()> {
        match self.quote {
            Some(q) => v.write_all(q(name).as_bytes()),
            _ => v.write_all(name),
        }
    }

    fn directive(
        &mut self,
        v: &mut impl Write,
        f: u8,
        next: Option<u8>,
        path: &[u8],
        ino: &Inode,
        depth: usize,
    ) -> Result<bool> {
        let r = &ino.rec;
        let mut used = false;
        match f {
            b'%' => v.write_all(b"%")?,
            b'p' => self.name_to(v, path)?,
            b'P' => {
                let rel = path.strip_prefix(self.start).unwrap_or(path);
                self.name_to(v, rel.strip_prefix(b"/").unwrap_or(rel))?
            }
            b'H' => self.name_to(v, self.start)?,
            b'f' => self.name_to(v, base(path))?,
            b'h' => {
                let d = match path.iter().rposition(|&b| b == b'/') {
                    Some(0) => &b"/"[..],
                    Some(k) => &path[..k],
                    None => &b"."[..],
                };
                self.name_to(v, d)?
            }
            b'd' => write!(v, "{depth}")?,
            b's' => write!(v, "{}", ino.stat_size())?,
            b'b' => write!(v, "{}", ino.stat_blocks())?,
            b'k' => write!(v, "{}", kib(ino))?,
            b'm' => write!(v, "{:o}", r.mode & 0o7777)?,
            b'M' => write!(v, "{}", mode_string(r.mode))?,
            b'y' => v.write_all(&[type_letter(ino.file_type())])?,
            b'l' => {
                if ino.file_type() == FileType::Symlink {
                    let t = self.img.read_link(ino)?;
                    self.name_to(v, &t)?
                }
            }
            b'u' => {
                let u = self.user(r.uid);
                v.write_all(u.as_bytes())?
            }
            b'g' => {
                let g = self.group(r.gid);
                v.write_all(g.as_bytes())?
            }
            b'U' => write!(v, "{}", r.uid)?,
            b'G' => write!(v, "{}", r.gid)?,
            b'i' => write!(v, "{}", ino.ino)?,
            b'n' => write!(v, "{}", r.nlink)?,
            b't' | b'a' | b'c' => {
                let t = time_field(b't', r.mtime_sec, r.mtime_nsec);
                v.write_all(t.as_bytes())?
            }
            b'T' | b'A' | b'C' => {
                let Some(k) = next else {
                    bail!("-printf: %{} needs a format letter after it", f as char)
                };
                let t = time_field(k, r.mtime_sec, r.mtime_nsec);
                v.write_all(t.as_bytes())?;
                used = true;
            }
            _ => bail!(
                "-printf: %{} is not supported (see sheaf find --help)",
                f as char
            ),
        }
        Ok(used)
    }
}

/// Walk `img` from `start` (a path as the user gave it, normalised by
/// [`start_path`]), evaluating `e` on every entry and writing what its
/// actions print to `out`. `quote`: when `out` is a terminal, how names are
/// quoted there (an image's names may hold escape sequences).
pub fn run<W: Write>(
    img: &Image,
    start: &[u8],
    e: &Expr,
    out: W,
    quote: Option<fn(&[u8]) -> String>,
) -> Result<W> {
    let ino = img.resolve(start)?;
    let mut ev = Eval::new(img, start, out, quote);
    let mut out_err: Option<FindError> = None;
    img.walk_in(e.order(), ino, start.to_vec(), &mut |p, ino, depth| {
        Ok(ev.visit(e, p, ino, depth, &mut out_err))
    })
    .map_err(FindError::Walk)?;
    ev.finish(out_err)
}

/// [`run`] over the merged tree of a stack of layers (whiteouts applied
/// and never seen): each entry is evaluated with the attributes of the
/// layer it shows from (a directory, its top layer's), `-empty` on a
/// directory means nothing shows through it, and `%i`, `-inum` and `-ls`
/// give an entry's inode number in its layer.
pub fn run_stack<W: Write>(
    stack: &Stack,
    start: &[u8],
    e: &Expr,
    out: W,
    quote: Option<fn(&[u8]) -> String>,
) -> Result<W> {
    let found = stack.resolve(start)?;
    let (l, _) = found.shown();
    let mut ev = Eval::new(&stack.layers()[l], start, out, quote);
    let mut out_err: Option<FindError> = None;
    stack
        .walk_in(e.order(), found, start.to_vec(), &mut |p, f, depth| {
            let (l, ino) = f.shown();
            ev.ctx.img = &stack.layers()[l];
            ev.ctx.merged = match f {
                Found::Dir(d) => Some((stack, d.clone())),
                Found::Node(..) => None,
            };
            Ok(ev.visit(e, p, &ino, depth, &mut out_err))
        })
        .map_err(FindError::Walk)?;
    ev.finish(out_err)
}

impl Expr {
    /// The order of the walk the expression asks for (`-depth`).
    fn order(&self) -> Order {
        if self.depth_first {
            Order::Post(self.max_depth)
        } else {
            Order::Pre
        }
    }
}

impl<'a, W: Write> Eval<'a, W> {
    fn new(img: &'a Image, start: &'a [u8], out: W, quote: Option<fn(&[u8]) -> String>) -> Self {
        Eval {
            ctx: Ctx {
                img,
                merged: None,
                start,
                names: crate::ident::Names::default(),
                quote,
            },
            now: now().0,
            scratch: Vec::new(),
            out,
            tty: quote.is_some(),
            quote,
            prune: false,
            quit: false,
        }
    }

    /// Evaluate `e` on one entry of the walk; where the walk goes next. An
    /// error (a closed pipe, `| head`, or a damaged entry) is kept in
    /// `out_err` and stops the walk.
    fn visit(
        &mut self,
        e: &Expr,
        p: &[u8],
        ino: &Inode,
        depth: usize,
        out_err: &mut Option<FindError>,
    ) -> Step {
        self.prune = false;
        if depth >= e.min_depth && depth <= e.max_depth {
            if let Err(err) = self.eval(&e.root, p, ino, depth) {
                out_err.get_or_insert(err);
                return Step::Stop;
            }
        }
        if self.quit {
            Step::Stop
        } else if self.prune || depth >= e.max_depth {
            Step::Prune
        } else {
            Step::Continue
        }
    }

    /// The output, once the walk is over, or the error that stopped it.
    fn finish(mut self, out_err: Option<FindError>) -> Result<W> {
        if let Some(err) = out_err {
            return Err(err);
        }
        self.out.flush()?;
        Ok(self.out)
    }
}
