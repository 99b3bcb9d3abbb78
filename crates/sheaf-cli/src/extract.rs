//! `sheaf extract`: arguments and the report; the extraction itself (and
//! its safety rules) is [`sheaf_read::extract`](mod@sheaf_read::extract).

use crate::util::human;
use crate::util::open_image as open_path;
use anyhow::Result;
use sheaf_read::ExtractOptions;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Arguments of `sheaf extract`.
#[derive(clap::Args, Debug)]
pub struct ExtractArgs {
    /// The image.
    image: PathBuf,
    /// Paths inside the image to extract (default: everything).
    paths: Vec<std::ffi::OsString>,
    /// Directory to extract into (created if missing).
    #[arg(
        short = 'C',
        long = "directory",
        default_value = ".",
        value_name = "DIR",
        value_hint = clap::ValueHint::DirPath
    )]
    dir: PathBuf,
    /// Go on past files the image cannot give (a damaged block): extract
    /// everything that verifies, list what is lost, and exit 1.
    #[arg(short = 'k', long)]
    keep_going: bool,
    /// Also create character and block devices and keep setuid and setgid
    /// bits, as the image has them (for restoring a system tree, as root).
    ///
    /// Without it devices are skipped and setuid/setgid bits are cleared
    /// from files, each counted in one line on stderr (and in --json):
    /// an image's author chooses device numbers, modes and owners, so an
    /// untrusted image could otherwise leave a world-writable /dev/mem or
    /// a setuid-root shell in DIR. (GNU tar's -p, which `tar -xpf` users
    /// type, is accepted too.)
    #[arg(
        short = 'p',
        long = "preserve",
        visible_alias = "same-permissions",
        alias = "preserve-permissions"
    )]
    preserve: bool,
    /// Replace files, symlinks and special files DIR already has where the
    /// image's entries go, as `unsquashfs -f` (directories are merged
    /// either way). Without it an existing name stops the extraction.
    ///
    /// What is in the way is removed by name, never followed: a symlink
    /// planted in DIR is replaced, and what it points to is untouched.
    #[arg(short = 'f', long)]
    force: bool,
    /// Print a JSON report on stdout (docs/json.md).
    #[arg(long)]
    json: bool,
}

/// `sheaf extract`.
pub fn run(
    a: ExtractArgs,
    remote: &crate::util::RemoteArgs,
    io: &mut crate::Io<'_>,
) -> Result<i32> {
    let img = open_path(&a.image, remote)?;
    if a.dir == Path::new(".") {
        if let Some(p) = a.paths.iter().find(|p| meant_as_target(&img, p)) {
            anyhow::bail!(
                "{}: no such file or directory in the image (PATHS are inside the image; \
                 to extract into that directory: sheaf extract -C {} {})",
                p.to_string_lossy(),
                p.to_string_lossy(),
                a.image.display()
            );
        }
    }
    // The user's own arguments first: a path that climbs is theirs, not
    // the image's; one the image lacks is refused before DIR is made.
    for p in &a.paths {
        if p.as_bytes().split(|&b| b == b'/').any(|c| c == b"..") {
            anyhow::bail!(
                "{}: PATHS name entries inside the image, from its root, without '..'",
                p.to_string_lossy()
            );
        }
        if let Err(e @ sheaf_read::ReadError::NotFound(_)) = img.resolve(p.as_bytes()) {
            return Err(e.into());
        }
    }
    let opts = ExtractOptions {
        target: a.dir.clone(),
        paths: a.paths.iter().map(|p| p.as_bytes().to_vec()).collect(),
        keep_going: a.keep_going,
        cancel: Some(io.cancel_flag()),
        devices: a.preserve,
        setuid: a.preserve,
        overwrite: a.force,
    };
    let s = match sheaf_read::extract(&img, &opts) {
        Ok(s) => s,
        Err(sheaf_read::ExtractError::Exists(path)) => {
            let full = a.dir.join(path.trim_start_matches('/'));
            anyhow::bail!(
                "{}: already exists (-f/--force replaces what is there; or extract into an empty directory with -C DIR)",
                full.display()
            );
        }
        Err(e @ sheaf_read::ExtractError::Read(_)) => anyhow::bail!(
            "{} (extraction stopped; sheaf extract --keep-going extracts every file that verifies and lists the others)",
            sheaf_format::one_line(&e)
        ),
        Err(e) => return Err(e.into()),
    };
    let lost: Vec<serde_json::Value> = s
        .lost
        .iter()
        .map(|l| serde_json::json!({"path": l.path, "error": l.error}))
        .collect();
    if a.json {
        writeln!(
            io.stdout,
            "{}",
            serde_json::json!({"directory": s.directory, "entries": s.entries, "bytes": s.bytes,
                "unrestored_attributes": s.unrestored, "first_unrestored": s.first_unrestored,
                "skipped_devices": s.skipped_devices,
                "first_skipped_device": s.first_skipped_device,
                "setuid_cleared": s.setuid_cleared,
                "first_setuid_cleared": s.first_setuid_cleared,
                "lost": lost})
        )?;
    } else {
        for l in &s.lost {
            let _ = writeln!(io.stderr, "sheaf: {}: lost: {}", l.path, l.error);
        }
        let _ = writeln!(
            io.stderr,
            "extracted {} entries ({}) into {}",
            s.entries,
            human(s.bytes),
            s.directory.display()
        );
        if s.skipped_devices > 0 {
            let _ = writeln!(
                io.stderr,
                "sheaf: {} device{} not created (first: {}; --preserve creates them)",
                s.skipped_devices,
                if s.skipped_devices == 1 { "" } else { "s" },
                s.first_skipped_device.as_deref().unwrap_or("?")
            );
        }
        if s.setuid_cleared > 0 {
            let _ = writeln!(
                io.stderr,
                "sheaf: setuid/setgid bits cleared on {} file{} (first: {}; --preserve keeps them)",
                s.setuid_cleared,
                if s.setuid_cleared == 1 { "" } else { "s" },
                s.first_setuid_cleared.as_deref().unwrap_or("?")
            );
        }
        if s.unrestored > 0 {
            let _ = writeln!(
                io.stderr,
                "sheaf: {} attributes could not be restored (first: {})",
                s.unrestored,
                s.first_unrestored.as_deref().unwrap_or("?")
            );
        }
        if !s.lost.is_empty() {
            let _ =
                writeln!(io.stderr,
                "sheaf: error: {} entr{} could not be read from {} and {} left out (listed above)",
                s.lost.len(),
                if s.lost.len() == 1 { "y" } else { "ies" },
                sheaf_net::redact(&a.image.to_string_lossy()),
                if s.lost.len() == 1 { "was" } else { "were" },
            );
        }
    }
    Ok(i32::from(!s.lost.is_empty()))
}

/// Whether `p`, missing from the image, looks like a directory to extract
/// into (`sheaf extract IMG DIR`, as `unsquashfs -d DIR` users would write):
/// it is a directory here, or could be created in one.
fn meant_as_target(img: &sheaf_read::Image, p: &std::ffi::OsStr) -> bool {
    if !matches!(
        img.resolve(p.as_bytes()),
        Err(sheaf_read::ReadError::NotFound(_))
    ) {
        return false;
    }
    let host = Path::new(p);
    host.is_dir()
        || host
            .parent()
            .is_some_and(|q| q.as_os_str().is_empty() || q.is_dir())
}
