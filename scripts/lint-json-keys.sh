#!/usr/bin/env bash
# Fails when Rust code outside tests looks up or sets a JSON field by a
# string (`v["key"]`, `v.get("key")`, `v.get(format!(..))`, `.pointer(..)`):
# a contract between a writer and its readers is a serde type they share
# (sheaf_format::build_info::BuildInfo, sheaf_read::info::ImageInfo,
# sheaf_read::{NetStats, StoreStats}, sheaf_mount::stats::Report, ...), with
# #[serde(default)] for what older writers left out (issue 43, point 2).
#
# Scope: the files of crates/*/src that use serde_json, up to the first
# `#[cfg(test)]` of each (unit tests follow it), without tests.rs files;
# integration tests read the documented --json output (docs/json.md) and
# are not checked. A lookup there that is not JSON (an HTTP header, a TOML
# table) says so with `// not JSON: WHY` on its line or the line before.
set -euo pipefail
cd "$(dirname "$0")/.."

pattern='[A-Za-z0-9_)\]]\[\s*"[^"]*"\s*\]|\.get\(\s*"|\.get\(\s*&?format!|\.get_mut\(\s*"|\.pointer(_mut)?\('

bad=$(find crates -path '*/src/*.rs' ! -name tests.rs ! -path '*/target/*' -print0 |
    xargs -0 grep -lZ 'serde_json' | sort -z |
    xargs -0 -r awk -v pat="$pattern" '
        FNR == 1 { done = 0; prev = "" }
        /^[[:space:]]*#\[cfg\(test\)\]/ { done = 1 }
        !done && $0 ~ pat && $0 !~ /self\.get\(/ && $0 !~ /\/\/ not JSON:/ && prev !~ /\/\/ not JSON:/ {
            # Skip comment lines.
            if ($0 !~ /^[[:space:]]*\/\//) printf "%s:%d: %s\n", FILENAME, FNR, $0
        }
        { prev = $0 }
    ')
if [ -n "$bad" ]; then
    echo "JSON fields looked up by string (use a shared serde type; see scripts/lint-json-keys.sh):" >&2
    echo "$bad" >&2
    exit 1
fi
echo "lint-json-keys: no JSON field looked up by string"
