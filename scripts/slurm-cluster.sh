#!/usr/bin/env bash
# A real Slurm cluster of namespaced nodes on this machine, for
# crates/sheaf-cli/tests/slurm.rs and bench/slurm.sh (the one home of its rules).
#
#   scripts/slurm-cluster.sh up WORK N     start it; prints the environment to use it
#   scripts/slurm-cluster.sh down WORK     stop it and remove everything it made
#
# Debian's munged, slurmctld and N slurmd. The controller and each node have a
# network, UTS and mount namespace of their own: host name (ctl, n1..nN),
# address (NET.1, NET.11..) on a bridge in a namespace of its own, spool
# (WORK/nodes/nK/spool) and node-local directory (WORK/nodes/nK/local, seen by
# the node's processes at WORK/local, Slurm's TmpFS). The host joins the bridge
# at NET.254 (srun and sbatch run there). `down` is safe to run at any time
# and twice: it kills what WORK/pids lists, deletes the namespaces WORK/netns
# lists and the host's link.
#
# Environment: PLUGSTACK (lines of plugstack.conf; empty: no SPANK plugin),
# SLURM_NET (default 10.78.0), SLURM_PREFIX (namespace and link names, default sl),
# SLURM_CPUS (per node, default 2), SLURM_EXTRA (more slurm.conf lines).
set -euo pipefail
cmd=${1:-}; W=${2:-}
[ -n "$cmd" ] && [ -n "$W" ] || { echo "usage: $0 up WORK N | down WORK" >&2; exit 2; }
NET=${SLURM_NET:-10.78.0}
P=${SLURM_PREFIX:-sl}
log() { printf '[slurm-cluster %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

down() {
    local pid ns i
    if [ -f "$W/pids" ]; then
        while read -r pid; do kill "$pid" 2>/dev/null || true; done < "$W/pids"
        for i in $(seq 50); do
            alive=0
            while read -r pid; do kill -0 "$pid" 2>/dev/null && alive=1; done < "$W/pids"
            [ $alive = 0 ] && break
            sleep 0.1
        done
        while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done < "$W/pids"
        rm -f "$W/pids"
    fi
    if [ -f "$W/netns" ]; then
        while read -r ns; do
            ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        done < "$W/netns"
        sleep 0.2
        while read -r ns; do ip netns del "$ns" 2>/dev/null || true; done < "$W/netns"
        rm -f "$W/netns"
    fi
    ip link del "$P-host" 2>/dev/null || true
}

if [ "$cmd" = down ]; then down; exit 0; fi
[ "$cmd" = up ] || die "unknown command $cmd"
N=${3:?N}
[ "$(id -u)" = 0 ] || die "must run as root (namespaces, slurmd)"
for c in munged slurmctld slurmd srun sinfo ip unshare nsenter runuser; do
    command -v "$c" >/dev/null || die "$c missing (scripts/deps.sh test installs Slurm and munge)"
done
trap 'rc=$?; [ $rc = 0 ] || down; exit $rc' EXIT
# Another cluster with these names (running, or left by a run killed before
# its `down`) is not ours to remove: say so.
if ip netns list | awk '{print $1}' | grep -q "^$P-" || ip link show "$P-host" >/dev/null 2>&1; then
    trap - EXIT
    die "namespaces $P-* or link $P-host exist: another cluster is up (or a killed run left them: \
scripts/slurm-cluster.sh down ITS_WORK, or ip netns del each $P-* and ip link del $P-host); SLURM_PREFIX and SLURM_NET choose others"
fi
mkdir -p "$W"/{etc,ctld,munge,local,log}
chmod 755 "$W" "$W/etc" "$W/local"
: > "$W/pids"; : > "$W/netns"

# --- munge: one daemon for the cluster, its socket in WORK -------------------
dd if=/dev/urandom of="$W/munge/munge.key" bs=1024 count=1 status=none
chown -R munge: "$W/munge"; chmod 700 "$W/munge"; chmod 400 "$W/munge/munge.key"
chmod 711 "$W/munge"   # clients reach the socket
runuser -u munge -- munged -F --force --socket="$W/munge/socket" --key-file="$W/munge/munge.key" \
    --pid-file="$W/munge/pid" --seed-file="$W/munge/seed" --log-file="$W/munge/log" \
    </dev/null >/dev/null 2>&1 &
echo $! >> "$W/pids"
for i in $(seq 50); do [ -S "$W/munge/socket" ] && break; sleep 0.1; done
[ -S "$W/munge/socket" ] || die "munged did not start: $(tail -n 3 "$W/munge/log" 2>/dev/null)"

# --- the network ---------------------------------------------------------------
source "$(dirname "$0")/netns.sh"
BR=$P-br
echo "$BR" >> "$W/netns"; netns_bridge "$BR"
# attach NS NUM: NS gets eth0 = NET.NUM/24 on the bridge, routes through the
# host (srun there is reached at the host's own addresses).
attach() {
    local ns=$1 n=$2
    ip netns add "$ns"; echo "$ns" >> "$W/netns"
    netns_attach "$BR" "$ns" "$NET.$n/24" "$P-b$n" "$P-e$n"
    ip -n "$ns" route add default via "$NET.254"
}
netns_host "$BR" "$P-host" "$P-bh" "$NET.254/24"
attach "$P-ctl" 1
for k in $(seq 1 "$N"); do attach "$P-n$k" $((10 + k)); done

# --- slurm.conf -----------------------------------------------------------------
CPUS=${SLURM_CPUS:-2}
cat > "$W/etc/slurm.conf" <<EOF
ClusterName=sheaftest
SlurmctldHost=ctl($NET.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$W/munge/socket
CredType=cred/munge
StateSaveLocation=$W/ctld
SlurmctldPidFile=$W/ctld/slurmctld.pid
SlurmctldLogFile=$W/log/slurmctld.log
SlurmdSpoolDir=$W/nodes/%n/spool
SlurmdPidFile=$W/nodes/%n/slurmd.pid
SlurmdLogFile=$W/nodes/%n/slurmd.log
SlurmdParameters=config_overrides
TmpFS=$W/local
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
PlugStackConfig=$W/etc/plugstack.conf
ReturnToService=2
KillWait=2
OverTimeLimit=0
MinJobAge=120
InactiveLimit=0
MessageTimeout=10
SlurmctldDebug=info
SlurmdDebug=info
${SLURM_EXTRA:-}
NodeName=DEFAULT CPUs=$CPUS RealMemory=1000 State=UNKNOWN
EOF
for k in $(seq 1 "$N"); do
    echo "NodeName=n$k NodeAddr=$NET.$((10 + k)) NodeHostname=n$k" >> "$W/etc/slurm.conf"
done
echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$W/etc/slurm.conf"
printf '%s\n' "${PLUGSTACK:-}" > "$W/etc/plugstack.conf"
chmod 644 "$W/etc/"*

# --- the daemons -----------------------------------------------------------------
# in_node NS HOST CMD...: CMD in NS's network, a new UTS and mount namespace
# named HOST, WORK/local bound to the node's own directory.
in_node() {
    local ns=$1 host=$2; shift 2
    mkdir -p "$W/nodes/$host/spool" "$W/nodes/$host/local"
    chmod 1777 "$W/nodes/$host/local"
    nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private \
        sh -c 'hostname "$1" && mount --bind "$2" "$3" && shift 3 && exec "$@"' \
        sh "$host" "$W/nodes/$host/local" "$W/local" "$@" </dev/null >>"$W/log/$host.out" 2>&1 &
    echo $! >> "$W/pids"
}
export SLURM_CONF=$W/etc/slurm.conf
in_node "$P-ctl" ctl slurmctld -D -i -f "$SLURM_CONF"
for k in $(seq 1 "$N"); do in_node "$P-n$k" "n$k" slurmd -D -N "n$k" -f "$SLURM_CONF"; done
for i in $(seq 300); do
    idle=$(sinfo -h -o '%T %D' 2>/dev/null | awk '$1 == "idle" {print $2}')
    [ "$idle" = "$N" ] && break
    sleep 0.1
done
[ "$idle" = "$N" ] || die "$N idle nodes wanted, sinfo says: $(sinfo -h 2>&1 | head -3); $(tail -n 3 "$W/log/slurmctld.log" 2>/dev/null)"
log "$N nodes up (SLURM_CONF=$SLURM_CONF)"
echo "SLURM_CONF=$SLURM_CONF"
