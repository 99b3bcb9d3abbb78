use super::*;
use std::os::unix::fs::{symlink, PermissionsExt};

fn victim(t: &Path) -> PathBuf {
    let v = t.join("victim");
    std::fs::write(&v, b"precious").unwrap();
    v
}

#[test]
fn a_planted_link_is_never_written_through() {
    let t = tempfile::tempdir().unwrap();
    let v = victim(t.path());
    let d = t.path().join("d");
    std::fs::create_dir(&d).unwrap();
    for n in ["new", "lock", "atomic"] {
        symlink(&v, d.join(n)).unwrap();
    }
    symlink(t.path(), d.join("sub")).unwrap();
    let dir = Dir::open(&d).unwrap();
    assert_eq!(
        dir.create_new("new", 0o644).unwrap_err().kind(),
        io::ErrorKind::AlreadyExists
    );
    let e = dir.open_lock("lock").unwrap_err().to_string();
    assert!(e.contains("symbolic link"), "{e}");
    assert!(dir.open_regular("lock").is_err());
    assert!(dir.sub("sub").is_err());
    assert!(dir.create_dir("sub", 0o755).is_err());
    assert!(dir.sub_path(Path::new("sub/x")).is_err());
    // write_atomic replaces the link itself.
    dir.write_atomic("atomic", b"new", 0o600).unwrap();
    assert_eq!(std::fs::read(&v).unwrap(), b"precious");
    assert_eq!(std::fs::read(d.join("atomic")).unwrap(), b"new");
    assert!(!std::fs::symlink_metadata(d.join("atomic"))
        .unwrap()
        .file_type()
        .is_symlink());
    // Removing a link removes the link, and remove_all does not go through
    // a link to a directory.
    dir.remove_file("new").unwrap();
    dir.remove_all("sub").unwrap();
    assert!(t.path().join("victim").exists());
    for bad in ["", ".", "..", "a/b"] {
        assert!(dir.create_new(bad, 0o600).is_err(), "{bad:?}");
    }
    assert_eq!(std::fs::read(&v).unwrap(), b"precious");
}

#[test]
fn a_lock_is_a_plain_file_with_one_link() {
    let t = tempfile::tempdir().unwrap();
    let dir = Dir::open(t.path()).unwrap();
    let a = dir.open_lock("l").unwrap();
    assert!(flock(&a, true, false).unwrap());
    let b = dir.open_lock("l").unwrap();
    assert!(!flock(&b, true, false).unwrap());
    drop(a);
    assert!(flock(&b, true, false).unwrap());
    std::fs::hard_link(t.path().join("l"), t.path().join("l2")).unwrap();
    assert!(dir.open_lock("l").is_err());
    rustix::fs::mknodat(
        dir.fd(),
        "fifo",
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    assert!(dir.open_lock("fifo").is_err());
    assert!(dir.open_regular("fifo").is_err());
}

#[test]
fn temporaries_are_new_and_unpredictable() {
    let t = tempfile::tempdir().unwrap();
    let dir = Dir::open(t.path()).unwrap();
    let (a, _) = dir.temp_file(".x-", ".tmp").unwrap();
    let (b, _) = dir.temp_file(".x-", ".tmp").unwrap();
    assert_ne!(a, b);
    let a = a.to_str().unwrap();
    assert!(a.starts_with(".x-") && a.ends_with(".tmp") && a.len() == 3 + 16 + 4);
    let m = std::fs::metadata(t.path().join(a)).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
}

#[test]
fn remove_all_is_iterative_and_stays_inside() {
    let t = tempfile::tempdir().unwrap();
    let v = victim(t.path());
    let root = Dir::create_all(&t.path().join("r"), 0o755).unwrap();
    // Deeper than any recursion would like, with a link to outside at the
    // bottom.
    let mut d = root.create_dir("top", 0o755).unwrap();
    for _ in 0..3000 {
        d = d.create_dir("d", 0o755).unwrap();
    }
    rustix::fs::symlinkat(&v, d.fd(), "out").unwrap();
    d.create_new("f", 0o600).unwrap();
    root.remove_all("top").unwrap();
    assert!(root.entries().unwrap().is_empty());
    assert_eq!(std::fs::read(&v).unwrap(), b"precious");
    root.remove_all("missing").unwrap();
}

#[test]
fn a_private_dir_is_made_0700_and_checked() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("a/b");
    let d = private_dir(&p).unwrap();
    assert_eq!(
        std::fs::metadata(t.path().join("a"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o700
    );
    d.create_new("x", 0o600).unwrap();
    assert!(p.join("x").exists());
    // Writable by others: refused.
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = private_dir(&p).unwrap_err();
    assert!(matches!(e, PrivateDirError::Writable { .. }), "{e}");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A parent writable by others (not sticky): refused.
    std::fs::set_permissions(t.path().join("a"), std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(
        private_dir(&p).unwrap_err(),
        PrivateDirError::Writable { .. }
    ));
    // Sticky, as /tmp: fine.
    std::fs::set_permissions(t.path().join("a"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    private_dir(&p).unwrap();
    // A link in its place: refused, and not created through.
    let l = t.path().join("link");
    symlink(&p, &l).unwrap();
    assert!(matches!(
        private_dir(&l).unwrap_err(),
        PrivateDirError::NotDir { .. }
    ));
}

#[test]
fn a_private_dir_owned_by_someone_else_is_refused() {
    if rustix::process::geteuid().as_raw() != 0 {
        // As an ordinary user the other owner cannot be made; the check is
        // the same comparison as the mode's, tested above.
        let e = private_dir(Path::new("/")).unwrap_err();
        assert!(matches!(e, PrivateDirError::Owner { .. }), "{e}");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("taken");
    std::fs::create_dir(&p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
    rustix::fs::chown(
        &p,
        Some(rustix::fs::Uid::from_raw(65534)),
        Some(rustix::fs::Gid::from_raw(65534)),
    )
    .unwrap();
    let e = private_dir(&p).unwrap_err();
    assert!(
        matches!(e, PrivateDirError::Owner { uid: 65534, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("uid 65534"), "{e}");
}

#[test]
fn xattrs_of_the_directory_and_of_entries_without_links() {
    let t = tempfile::tempdir().unwrap();
    let dir = Dir::open(t.path()).unwrap();
    assert_eq!(dir.xattr("user.sheaf-test").unwrap(), None);
    xattr::set(t.path(), "user.sheaf-test", b"y").unwrap();
    symlink(t.path(), t.path().join("l")).unwrap();
    // Through the link name: the link's own (none), not the directory's.
    assert_eq!(dir.entry_xattr("l", "user.sheaf-test").unwrap(), None);
    dir.create_new("f", 0o600).unwrap();
    xattr::set(t.path().join("f"), "user.sheaf-test", b"f").unwrap();
    assert_eq!(
        dir.entry_xattr("f", "user.sheaf-test").unwrap().as_deref(),
        Some(&b"f"[..])
    );
    assert_eq!(
        dir.xattr("user.sheaf-test").unwrap().as_deref(),
        Some(&b"y"[..])
    );
    dir.remove_xattr("user.sheaf-test").unwrap();
    assert_eq!(dir.xattr("user.sheaf-test").unwrap(), None);
}
