#!/usr/bin/env bash
# make demo: pack a sample tree, inspect it, verify it, unpack it and compare.
set -euo pipefail
cd "$(dirname "$0")/.."
S=$PWD/target/release/sheaf
W=$(mktemp -d /tmp/sheaf-demo.XXXXXX)
NGINX_PID=""
cleanup() {
    "$S" umount --lazy "$W/mnt" 2>/dev/null || true
    [ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. a sample tree: /usr/share/doc plus files of every kind"
mkdir -p "$W/src/kinds/sub"
cp -a /usr/share/doc "$W/src/doc" 2>/dev/null || true
printf 'hello, sheaf\n' > "$W/src/kinds/hello.txt"
cp "$W/src/kinds/hello.txt" "$W/src/kinds/same-content.txt"      # deduplicated
ln "$W/src/kinds/hello.txt" "$W/src/kinds/hardlink.txt"             # one inode
ln -s hello.txt "$W/src/kinds/symlink"
mkfifo "$W/src/kinds/fifo"
truncate -s 2G "$W/src/kinds/sparse.img"; echo end >> "$W/src/kinds/sparse.img"  # holes not stored
python3 -c "import os; os.setxattr('$W/src/kinds/hello.txt', 'user.origin', b'demo')"
chmod 4755 "$W/src/kinds/sub"
echo "$(find "$W/src" | wc -l) entries, $(du -sh --apparent-size "$W/src" | cut -f1) apparent"

step "2. sheaf build"
t0=$(date +%s.%N)
"$S" build "$W/src" -o "$W/demo.sheaf"
t1=$(date +%s.%N)

step "3. sheaf info"
"$S" info "$W/demo.sheaf"

step "4. sheaf ls -l kinds ; sheaf cat kinds/hello.txt"
"$S" ls -l "$W/demo.sheaf" kinds
"$S" cat "$W/demo.sheaf" kinds/hello.txt

step "5. sheaf check (every page and block against its BLAKE3 hash)"
"$S" check "$W/demo.sheaf"

step "6. sheaf extract, then compare with the source"
"$S" extract "$W/demo.sheaf" -C "$W/out"
# diff cannot compare FIFOs; everything else must be identical.
d=$(diff -r --no-dereference "$W/src" "$W/out" | grep -v 'is a fifo while file' || true)
[ -z "$d" ] && echo "contents identical" || { echo "$d"; exit 1; }
[ "$(stat -c %i "$W/out/kinds/hello.txt")" = "$(stat -c %i "$W/out/kinds/hardlink.txt")" ] && echo "hardlink kept"
python3 -c "import os; assert os.getxattr('$W/out/kinds/hello.txt','user.origin')==b'demo'" && echo "xattr kept"
echo "sparse file uses $(du -k "$W/out/kinds/sparse.img" | cut -f1) KiB on disk for $(stat -c %s "$W/out/kinds/sparse.img") bytes"

step "7. a corrupted copy is refused, naming the damaged block"
cp "$W/demo.sheaf" "$W/bad.sheaf"
printf '\xff' | dd of="$W/bad.sheaf" bs=1 seek=100 conv=notrunc status=none
"$S" check "$W/bad.sheaf" || echo "(exit $? as expected)"

step "8. sheaf mount (FUSE, no root needed), read it, stats, umount"
mkdir "$W/mnt"
m0=$(date +%s%N)
"$S" mount "$W/demo.sheaf" "$W/mnt"
m1=$(date +%s%N)
echo "mounted in $(( (m1 - m0) / 1000000 )) ms: $(grep " $W/mnt " /proc/mounts | cut -d' ' -f1-3)"
ls -l "$W/mnt/kinds"
d=$(diff -r --no-dereference "$W/src" "$W/mnt" | grep -v 'is a fifo while file' || true)
[ -z "$d" ] && echo "mounted tree identical to the source" || { echo "$d"; exit 1; }
[ "$(stat -c %i "$W/mnt/kinds/hello.txt")" = "$(stat -c %i "$W/mnt/kinds/hardlink.txt")" ] && echo "hardlinks share an inode"
getfattr -n user.origin "$W/mnt/kinds/hello.txt" 2>/dev/null | grep origin || python3 -c "import os; print('user.origin =', os.getxattr('$W/mnt/kinds/hello.txt','user.origin'))"
touch "$W/mnt/new" 2>&1 | sed 's/^/writes refused: /' || true
"$S" stats "$W/mnt"
"$S" umount "$W/mnt"
grep -q " $W/mnt " /proc/mounts && { echo "still mounted"; exit 1; } || echo "unmounted, server gone"

step "9. sign with an SSH key, verify against allowed_signers, mount only if trusted"
ssh-keygen -q -t ed25519 -N "" -C demo -f "$W/key"
echo "demo@example.org $(cut -d' ' -f1-2 "$W/key.pub")" > "$W/allowed_signers"
"$S" sign "$W/demo.sheaf" -k "$W/key" --identity demo@example.org
"$S" verify "$W/demo.sheaf" --signers "$W/allowed_signers"
"$S" root "$W/demo.sheaf" | ssh-keygen -Y verify -f "$W/allowed_signers" -I demo@example.org -n sheaf \
    -s <("$S" sign "$W/demo.sheaf" -k "$W/key" --detached >/dev/null && cat "$W/demo.sheaf.sig") \
    && echo "(ssh-keygen agrees)"
"$S" mount --require-signature --signers "$W/allowed_signers" "$W/bad.sheaf" "$W/mnt" 2>&1 || echo "(unsigned copy refused, exit $?)"

step "10. over HTTP: publish, serve with nginx on loopback, mount the URL lazily, then offline"
"$S" publish "$W/demo.sheaf" "$W/www/repo" --name demo
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$W/nginx"
printf '%s\n' "daemon off; master_process off; pid $W/nginx/pid; error_log $W/nginx/error.log;" \
    "events { worker_connections 64; }" \
    "http { access_log off; client_body_temp_path $W/nginx; proxy_temp_path $W/nginx;" \
    "  fastcgi_temp_path $W/nginx; uwsgi_temp_path $W/nginx; scgi_temp_path $W/nginx;" \
    "  server { listen 127.0.0.1:$port; root $W/www; } }" > "$W/nginx/nginx.conf"
PATH=$PATH:/usr/sbin nginx -e "$W/nginx/error.log" -c "$W/nginx/nginx.conf" &
NGINX_PID=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
url=http://127.0.0.1:$port/repo/demo
"$S" mount --cache-dir "$W/cache" "$url" "$W/mnt"
cat "$W/mnt/kinds/hello.txt"
"$S" stats "$W/mnt" | grep -E "^(image|network|node cache)"
"$S" umount "$W/mnt"
kill "$NGINX_PID"; wait "$NGINX_PID" 2>/dev/null || true; NGINX_PID=""
"$S" mount --cache-dir "$W/cache" "$url" "$W/mnt"
echo "server gone, remounted from the node cache: $(cat "$W/mnt/kinds/hello.txt")"
"$S" umount "$W/mnt"
"$S" cache stats --cache-dir "$W/cache"

step "11. layers: a writable overlay, commit its changes as a layer, stack it; sheaf run at /data"
mkdir -p "$W/upper" "$W/mnt2"
"$S" mount "$W/demo.sheaf" "$W/mnt" --upper "$W/upper"
echo "changed in the overlay" > "$W/mnt/kinds/hello.txt"; rm -r "$W/mnt/kinds/sub"; mkdir "$W/mnt/results"
echo 42 > "$W/mnt/results/answer"
"$S" umount "$W/mnt"
echo "upper directory: $(cd "$W/upper" && find . -mindepth 1 | sort | tr '\n' ' ')"
"$S" commit "$W/upper" -o "$W/layer.sheaf" -q
"$S" mount "$W/demo.sheaf" "$W/layer.sheaf" "$W/mnt2"
echo "base + layer: kinds/hello.txt = $(cat "$W/mnt2/kinds/hello.txt"); kinds/sub $( [ -e "$W/mnt2/kinds/sub" ] && echo present || echo hidden)"
"$S" umount "$W/mnt2"
"$S" run --mount "$W/demo.sheaf,$W/layer.sheaf:/data" -- sh -c 'echo "inside sheaf run: /data/results/answer = $(cat /data/results/answer)"'
[ -e /data/results ] && echo "(/data exists outside too)" || echo "outside: /data/results does not exist; nothing left mounted"

step "report"
src=$(du -sb "$W/src" | cut -f1); img=$(stat -c %s "$W/demo.sheaf")
printf 'source %s bytes (apparent), image %s bytes, built in %.2f s; round trip exact;\n' "$src" "$img" "$(echo "$t1 - $t0" | bc)"
printf 'mounted in %d ms, identical to the source, unmounted cleanly; signed and verified with an SSH key;\n' $(( (m1 - m0) / 1000000 ))
printf 'published, mounted lazily over HTTP, and remounted offline from the node cache;\n'
printf 'changed in a writable overlay, committed as a layer, stacked, and given to a command at /data.\n'
