#!/usr/bin/env bash
# Fails when the crate graph docs/architecture.md states (the table between
# its crate-graph markers: each workspace crate and the workspace crates it
# uses) differs from Cargo's: `cargo metadata`, normal dependencies only
# (dev-dependencies are for tests; build-dependencies have none here).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo metadata --format-version 1 --no-deps --locked --offline |
    python3 -c '
import json, re, sys

meta = json.load(sys.stdin)
ours = {p["name"] for p in meta["packages"]}
cargo = {
    p["name"]: sorted({d["name"] for d in p["dependencies"]
                       if d["name"] in ours and d.get("kind") is None})
    for p in meta["packages"]
}

doc = open("docs/architecture.md", encoding="utf-8").read()
m = re.search(r"<!-- crate-graph[^>]*-->(.*?)<!-- /crate-graph -->", doc, re.S)
if not m:
    sys.exit("docs/architecture.md: no crate-graph table")
stated = {}
for line in m.group(1).splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 2 or not cells[0].startswith("`"):
        continue
    name = cells[0].strip("`")
    stated[name] = sorted(re.findall(r"`([^`]+)`", cells[1]))

bad = []
for name in sorted(ours | set(stated)):
    if name not in stated:
        bad.append(f"{name}: a workspace crate the table leaves out")
    elif name not in cargo:
        bad.append(f"{name}: in the table, not in the workspace")
    elif stated[name] != cargo[name]:
        more = sorted(set(cargo[name]) - set(stated[name]))
        less = sorted(set(stated[name]) - set(cargo[name]))
        bad.append("%s: Cargo.toml also uses %s; the table also says %s"
                   % (name, more or "nothing", less or "nothing"))
if bad:
    print("docs/architecture.md does not match cargo metadata:", file=sys.stderr)
    for b in bad:
        print("  " + b, file=sys.stderr)
    sys.exit(1)
print(f"check-crate-graph: docs/architecture.md matches cargo metadata ({len(ours)} crates)")
'
