# Network namespaces on a bridge, the one home of these rules: sourced by
# bench/cluster.sh (the simulated cluster) and scripts/slurm-cluster.sh (the
# Slurm test cluster). Callers name things and remove what they made.

# netns_bridge BRNS: a new namespace BRNS holding the bridge br0, up.
netns_bridge() {
    local br=$1
    ip netns add "$br"
    ip -n "$br" link add br0 type bridge
    ip -n "$br" link set br0 up
    ip -n "$br" link set lo up
}

# netns_attach BRNS NS ADDR/LEN BRIF NSIF: the existing namespace NS gets
# eth0 = ADDR on BRNS's bridge, through the veth pair BRIF (bridge side) and
# NSIF (renamed eth0 in NS); NS's loopback is up.
netns_attach() {
    local br=$1 ns=$2 addr=$3 a=$4 b=$5
    ip link add "$a" type veth peer name "$b"
    ip link set "$a" netns "$br"
    ip link set "$b" netns "$ns"
    ip -n "$ns" link set "$b" name eth0
    ip -n "$ns" addr add "$addr" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$br" link set "$a" master br0 up
}

# netns_host BRNS HOSTIF BRIF ADDR/LEN: the host's namespace joins BRNS's
# bridge as HOSTIF = ADDR (remove it with `ip link del HOSTIF`).
netns_host() {
    local br=$1 h=$2 a=$3 addr=$4
    ip link add "$h" type veth peer name "$a"
    ip link set "$a" netns "$br"
    ip -n "$br" link set "$a" master br0 up
    ip addr add "$addr" dev "$h"
    ip link set "$h" up
}
