# Shared by bench scripts (sourced). Callers define die(), PYTHON, WORK (a
# scratch directory) and WWW (the directory to serve).

# start_nginx: serve $WWW on a free loopback port with a real nginx; sets
# PORT, BASE (http://127.0.0.1:PORT) and NGINX_PID (the caller kills it).
# With NGINX_ACCESS_LOG set, each response's body bytes are logged there, one
# number a line (what the origin sent: awk '{s+=$1} END {print s}').
NGINX_PID=""
start_nginx() {
    PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    local t=$WORK/nginx-tmp i
    mkdir -p "$t"
    cat > "$WORK/nginx.conf" <<EOF
daemon off;
master_process off;
pid $t/nginx.pid;
error_log $t/error.log;
events { worker_connections 1024; }
http { log_format b '\$body_bytes_sent'; access_log ${NGINX_ACCESS_LOG:-off}${NGINX_ACCESS_LOG:+ b};
       sendfile on; client_body_temp_path $t; proxy_temp_path $t;
       fastcgi_temp_path $t; uwsgi_temp_path $t; scgi_temp_path $t;
       server { listen 127.0.0.1:$PORT; root $WWW; } }
EOF
    nginx -e "$t/error.log" -c "$WORK/nginx.conf" </dev/null &
    NGINX_PID=$!
    for i in $(seq 100); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/")" != 000 ] && break
        kill -0 "$NGINX_PID" 2>/dev/null || die "nginx exited: $(tail -n 3 "$t/error.log" 2>/dev/null)"
        sleep 0.1
    done
    BASE=http://127.0.0.1:$PORT
}

# server_pid PATTERN: the pid of the sheaf server whose command line matches
# PATTERN (pgrep -f), not its watchdog: a root mount's watchdog is a fork of
# the server with the same command line, named sheaf-watchdog.
server_pid() {
    local p
    for p in $(pgrep -f -- "$1" || true); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = sheaf-watchdog ] || { echo "$p"; return 0; }
    done
}

# start_squid_on ADDR:PORT DIR [NETNS]: a squid listening on ADDR:PORT (in
# network namespace NETNS if given) with a memory cache and concurrent misses
# collapsed into one fetch, its files in DIR (made afresh: a cold cache);
# sets SQUID_PID (stop_squid stops it).
SQUID_PID=""
start_squid_on() {
    local listen=$1 dir=$2 ns=${3:-} i run=()
    [ -n "$ns" ] && run=(ip netns exec "$ns")
    rm -rf "$dir"; mkdir -p "$dir"; chown proxy: "$dir" 2>/dev/null || true
    cat > "$dir/squid.conf" <<EOF
http_port $listen
http_access allow all
cache_mem 1024 MB
maximum_object_size_in_memory 16 MB
maximum_object_size 64 MB
collapsed_forwarding on
pid_filename $dir/pid
cache_log $dir/cache.log
access_log none
coredump_dir $dir
shutdown_lifetime 0 seconds
EOF
    "${run[@]}" squid -N -f "$dir/squid.conf" </dev/null >/dev/null 2>&1 &
    SQUID_PID=$!
    for i in $(seq 100); do
        "${run[@]}" bash -c "exec 3<>/dev/tcp/${listen%:*}/${listen##*:}" 2>/dev/null && return 0
        sleep 0.1
    done
    die "squid did not start: $(tail -n 3 "$dir/cache.log")"
}
stop_squid() { kill "$SQUID_PID" 2>/dev/null || true; wait "$SQUID_PID" 2>/dev/null || true; }
