# Shared by bench scripts (sourced). Callers define die(), PYTHON, WORK (a
# scratch directory) and WWW (the directory to serve).

# start_nginx: serve $WWW on a free loopback port with a real nginx; sets
# PORT, BASE (http://127.0.0.1:PORT) and NGINX_PID (the caller kills it).
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
http { access_log off; sendfile on; client_body_temp_path $t; proxy_temp_path $t;
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
