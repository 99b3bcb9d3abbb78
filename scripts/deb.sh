#!/usr/bin/env bash
# A Debian package of the built sheaf (`make deb` builds first): what
# `make install-files` installs with PREFIX=/usr (sheaf, libexec/sheaf/sheaf-full,
# /sbin/mount.fuse.sheaf, the snapshotter's systemd units as conffiles, man
# pages, bash/zsh/fish completions, the Slurm plugin /usr/lib/sheaf/sheaf_spank.so
# when it was built beside sheaf, and its man page sheaf-slurm(8)), Depends from
# dpkg-shlibdeps plus fuse3.
# Usage: scripts/deb.sh [OUTDIR]   (default target/debian; prints the .deb's path)
# SHEAF=path/to/sheaf picks other binaries (sheaf-full beside it).
set -euo pipefail
umask 022
cd "$(dirname "$0")/.."
out=${1:-target/debian}
sheaf=${SHEAF:-target/release/sheaf}
for b in "$sheaf" "$sheaf-full"; do
  [ -x "$b" ] || { echo "deb: $b is not built (make build)" >&2; exit 1; }
done
command -v dpkg-deb >/dev/null || { echo "deb: dpkg-deb is missing (package dpkg)" >&2; exit 1; }

version=$("$sheaf" --version | awk '{print $2}')
[[ "$version" =~ ^[0-9][A-Za-z0-9.+~-]*$ ]] || { echo "deb: bad version '$version' from $sheaf --version" >&2; exit 1; }
arch=$(dpkg --print-architecture)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# debian/sheaf: where dpkg-shlibdeps expects a package's files.
stage=$work/debian/sheaf
make --no-print-directory -s install-files DESTDIR="$stage" PREFIX=/usr SHEAF="$sheaf"
gzip -9n "$stage"/usr/share/man/man1/*.1 "$stage"/usr/share/man/man8/*.8
install -d "$stage/usr/share/doc/sheaf"
cat > "$stage/usr/share/doc/sheaf/copyright" <<'EOF'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: sheaf

Files: *
License: Apache-2.0 or MIT
 On Debian systems the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
EOF

# Libraries the programs link (libc6, libgcc-s1, and an MPI library when
# built with MPI), as dpkg-shlibdeps finds them; without it, by hand.
install -d "$stage/DEBIAN"   # (also how dpkg-shlibdeps knows the package's root)
shlibs=""
if command -v dpkg-shlibdeps >/dev/null; then
  printf 'Source: sheaf\n\nPackage: sheaf\nArchitecture: any\n' > "$work/debian/control"
  shlibs=$(cd "$work" && dpkg-shlibdeps -O -edebian/sheaf/usr/bin/sheaf \
             -edebian/sheaf/usr/libexec/sheaf/sheaf-full | sed -n 's/^shlibs:Depends=//p')
fi
if [ -z "$shlibs" ]; then
  shlibs="libc6 (>= 2.34), libgcc-s1 (>= 4.2)"
  if ldd "$sheaf-full" | grep -q 'libmpi\.so\.40'; then shlibs+=", libopenmpi3"; fi
fi

(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
  > "$stage/DEBIAN/md5sums"
printf '%s\n' /etc/systemd/system/sheaf-snapshotter.service /etc/systemd/system/sheaf-snapshotter.socket > "$stage/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<EOF
Package: sheaf
Version: $version
Architecture: $arch
Maintainer: ${DEB_MAINTAINER:-sheaf developers <sheaf@localhost>}
Installed-Size: $size
Depends: $shlibs, fuse3
Section: utils
Priority: optional
Description: pack directory trees into verifiable read-only images
 sheaf packs a directory tree (a dataset, a software stack, a container
 root) into one compressed, deduplicated image whose every byte is checked
 against a BLAKE3 hash, and mounts images with FUSE without root, from
 local files or lazily over HTTP. Images can be signed with OpenSSH keys.
 .
 Includes the mount(8) helper for -t fuse.sheaf, the containerd
 snapshotter's systemd units (not enabled), man pages and completions.
EOF
mkdir -p "$out"
deb=$out/sheaf_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "$deb"
