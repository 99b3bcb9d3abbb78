#!/usr/bin/env bash
# Run pjdfstest (the Rust POSIX file-system test suite, crates.io `pjdfstest`)
# in DIR, as root, and summarize.
#
# Usage: scripts/pjdfstest.sh DIR [--json FILE] [--log FILE] [--secondary DIR2|none]
#                             [-- PATTERN...]
#   DIR          directory to test in (e.g. a `sheaf mount ... --upper` mount point);
#                it and its parents must be searchable by `nobody`, so a FUSE
#                mount needs allow_other (and default_permissions for the EACCES tests).
#   --json FILE  also write {passed, failed, skipped, failures:[...], ...} to FILE
#   --log FILE   keep pjdfstest's full output (per-test lines and panic messages)
#   --secondary  a directory on another file system, for the EXDEV tests of
#                link/rename; default: a fresh one under /dev/shm, /tmp or
#                /var/tmp, whichever is on another device than DIR; `none` skips them
#   PATTERN      run only tests whose name contains one of them (e.g. chmod rename::)
# Env: PJDFSTEST_CONFIG  a pjdfstest TOML config to use instead of the built-in one
#      PJDFSTEST_TIMEOUT seconds for the whole run (default 900)
#
# Prints the failing tests (with the first line of each panic message) and, last,
# `pjdfstest: P passed, F failed, S skipped`.
# Exit: 0 when the suite ran to its end, whatever the failures (the caller
# decides); 2 when the harness could not run (no binary, bad DIR, not root);
# 3 when pjdfstest did not finish (timed out or crashed: counts are partial,
# and the JSON has "complete": false).
#
# The binary is built once with `cargo install --locked pjdfstest@VERSION` into
# target/tools (its own temporary build dir, not the workspace's) and reused.
set -euo pipefail
export LC_ALL=C

PJDFSTEST_VERSION=0.2.2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
tools=$root/target/tools
bin=$tools/bin/pjdfstest

die() { echo "pjdfstest.sh: $*" >&2; exit 2; }

dir="" json="" log="" secondary="auto" patterns=()
while [ $# -gt 0 ]; do
  case "$1" in
    --json) [ $# -ge 2 ] || die "--json needs a file"; json=$2; shift 2 ;;
    --log) [ $# -ge 2 ] || die "--log needs a file"; log=$2; shift 2 ;;
    --secondary) [ $# -ge 2 ] || die "--secondary needs a directory or none"; secondary=$2; shift 2 ;;
    --) shift; patterns+=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$dir" ] || die "one DIR only (got $dir and $1)"; dir=$1; shift ;;
  esac
done
[ -n "$dir" ] || die "usage: $0 DIR [--json FILE] [--log FILE] [--secondary DIR2|none] [-- PATTERN...]"
[ -d "$dir" ] || die "$dir: not a directory"
dir=$(cd "$dir" && pwd -P)

# --- the binary, built once -------------------------------------------------
export PATH="$HOME/.cargo/bin:/usr/local/cargo/bin:$PATH"
have_bin() { [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "pjdfstest $PJDFSTEST_VERSION" ]; }
if ! have_bin; then
  mkdir -p "$tools"
  exec 9>"$tools/.pjdfstest.lock"
  flock 9                       # another run may be building it right now
  if ! have_bin; then
    # exacl links libacl.so (libacl1-dev); deps.sh installs only what is missing.
    if ! ls /usr/lib/*/libacl.so /usr/lib/libacl.so >/dev/null 2>&1; then
      "$here/deps.sh" >&2 || die "deps.sh failed"
    fi
    command -v cargo >/dev/null || die "cargo not found"
    echo "pjdfstest.sh: building pjdfstest $PJDFSTEST_VERSION into $tools (once)" >&2
    blog=$tools/pjdfstest-build.log
    # From / so no project .cargo/config applies; without CARGO_TARGET_DIR cargo
    # install builds in its own temporary directory and removes it.
    if ! (cd / && env -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET_DIR \
            cargo install --locked --quiet --force "pjdfstest@$PJDFSTEST_VERSION" --root "$tools") >"$blog" 2>&1; then
      tail -n 30 "$blog" >&2
      die "building pjdfstest failed (full log: $blog)"
    fi
    have_bin || die "built $bin but it does not report version $PJDFSTEST_VERSION"
  fi
  exec 9>&-
fi

# --- root ---------------------------------------------------------------------
run_as_root=()
if [ "$(id -u)" -ne 0 ]; then
  sudo -n true 2>/dev/null || die "needs root (chown and user-switching tests); run as root or with passwordless sudo"
  run_as_root=(sudo -n)
fi

tmp=$(mktemp -d)
sec_made=""
cleanup() { rm -rf "$tmp"; [ -z "$sec_made" ] || "${run_as_root[@]}" rm -rf "$sec_made"; }
trap cleanup EXIT

# --- users and config -----------------------------------------------------------
# Two unprivileged users, each with its own primary group; Debian has no `tests`
# user (pjdfstest's default), so use existing system accounts rather than add one.
users=()
for u in nobody daemon bin sys; do
  id -u "$u" >/dev/null 2>&1 || continue
  [ "$(id -u "$u")" -ne 0 ] || continue
  users+=("$u:$(id -gn "$u")")
  [ ${#users[@]} -lt 2 ] || break
done
[ ${#users[@]} -eq 2 ] || die "need two unprivileged users among nobody, daemon, bin, sys"
u1=${users[0]%%:*} g1=${users[0]#*:} u2=${users[1]%%:*} g2=${users[1]#*:}

if [ -n "${PJDFSTEST_CONFIG:-}" ]; then
  [ -r "$PJDFSTEST_CONFIG" ] || die "PJDFSTEST_CONFIG=$PJDFSTEST_CONFIG: not readable"
  config=$PJDFSTEST_CONFIG
else
  config=$tmp/pjdfstest.toml
  # The Linux features pjdfstest knows (see `pjdfstest -l`); naptime must exceed
  # the timestamp granularity (upstream uses 0.01 for ext4). EROFS tests stay
  # skipped: they need to remount DIR read-only (allow_remount).
  cat >"$config" <<EOF
[features]
posix_fallocate = {}
rename_ctime = {}
utime_now = {}
utimensat = {}

[settings]
naptime = 0.01
allow_remount = false

[dummy_auth]
entries = [["$u1", "$g1"], ["$u2", "$g2"]]
EOF
  chmod 644 "$config"
fi

# Tests run as $u1/$u2 inside DIR: it must be reachable by them (this also
# catches a FUSE mount without allow_other).
if ! "${run_as_root[@]}" setpriv --reuid="$u1" --regid="$g1" --clear-groups test -x "$dir/." -a -r "$dir/." 2>/dev/null; then
  die "$dir is not searchable by $u1 (mode of it or a parent, or a FUSE mount without allow_other)"
fi
"${run_as_root[@]}" test -w "$dir/." || die "$dir is not writable by root"

# --- secondary file system for EXDEV ------------------------------------------------
sec_args=()
if [ "$secondary" = auto ]; then
  ddev=$(stat -c %d "$dir")
  for c in /dev/shm /tmp /var/tmp; do
    [ -d "$c" ] && [ -w "$c" ] && [ "$(stat -c %d "$c")" != "$ddev" ] || continue
    sec_made=$(mktemp -d "$c/pjdfstest-xdev.XXXXXX") || continue
    chmod 755 "$sec_made"
    sec_args=(-s "$sec_made")
    break
  done
elif [ "$secondary" != none ]; then
  [ -d "$secondary" ] || die "--secondary $secondary: not a directory"
  sec_args=(-s "$secondary")
fi

# --- run ---------------------------------------------------------------------------
out=${log:-$tmp/pjdfstest.out}
timeout_s=${PJDFSTEST_TIMEOUT:-900}
umask 022   # pjdfstest creates its base dir before it clears the umask: keep it 0755
start=$EPOCHREALTIME
set +e
(cd "$dir" && "${run_as_root[@]}" env NO_COLOR=1 RUST_BACKTRACE=0 \
   timeout -k 30 "$timeout_s" "$bin" -c "$config" -p "$dir" "${sec_args[@]}" -- "${patterns[@]}") \
   >"$out" 2>&1 </dev/null
rc=$?
set -e
secs=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')

# Per-test lines: NAME <spaces> ok|FAILED|skipped|failed as expected|PASSED UNEXPECTEDLY;
# a failure is followed by a tab-indented panic message.
parsed=$tmp/parsed
awk '
  function flush() { if (pend != "") { print "F\t" pend "\t" substr(msg, 1, 200); pend = ""; msg = "" } }
  /^[^ \t]+ +(ok|FAILED|skipped|failed as expected|PASSED UNEXPECTEDLY)$/ {
    flush(); name = $1
    if ($0 ~ / ok$/) print "P\t" name
    else if ($0 ~ / skipped$/) print "S\t" name
    else if ($0 ~ /FAILED$/) { pend = name; msg = "" }
    else if ($0 ~ /failed as expected$/) print "P\t" name
    else { pend = name; msg = "passed, but listed in expected_failures" }
    next
  }
  pend != "" && /^[ \t]/ && !/^[ \t]*$/ {     # the panic message, possibly several lines
    m = $0; gsub(/[ \t]+/, " ", m); sub(/^ /, "", m)
    if (length(msg) < 200) msg = (msg == "" ? m : msg "; " m)
    next
  }
  /^Summary:/ { flush(); print "END" }
  END { flush() }
' "$out" >"$parsed"
passed=$(grep -c '^P' "$parsed" || true)
failed=$(grep -c '^F' "$parsed" || true)
skipped=$(grep -c '^S' "$parsed" || true)
complete=false; grep -qx END "$parsed" && complete=true

if [ "$complete" = false ]; then
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why="timed out after ${timeout_s}s"; else why="exited with status $rc before its summary"; fi
  echo "pjdfstest: did not finish ($why); last lines:" >&2
  tail -n 5 "$out" | sed 's/^/  /' >&2
fi
while IFS=$'\t' read -r kind name msg; do
  [ "$kind" = F ] || continue
  echo "  FAILED $name${msg:+: $msg}"
done <"$parsed"

if [ -n "$json" ]; then
  {
    printf '{"passed": %d, "failed": %d, "skipped": %d, "complete": %s, "seconds": %.1f, "version": "%s",\n "failures": [' \
      "$passed" "$failed" "$skipped" "$complete" "$secs" "$PJDFSTEST_VERSION"
    awk -F'\t' '$1 == "F" { printf "%s\"%s\"", (n++ ? ", " : ""), $2 }' "$parsed"
    printf '],\n "reasons": {'
    awk -F'\t' '$1 == "F" { m = $3; gsub(/\\/, "\\\\", m); gsub(/"/, "\\\"", m); gsub(/\t/, " ", m)
                            printf "%s\n  \"%s\": \"%s\"", (n++ ? "," : ""), $2, m }' "$parsed"
    printf '}}\n'
  } >"$json"
fi

echo "pjdfstest: $passed passed, $failed failed, $skipped skipped"
[ "$complete" = true ] || exit 3
exit 0
