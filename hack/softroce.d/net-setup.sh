#!/bin/sh
# Guest network for soft-RoCE: a veth pair whose two ends talk to each other through the
# veth (not through lo), and one rxe device on each end.
#
#   rxe0 -- veth0 (SOFTROCE_ADDR0) <==veth==> veth1 (SOFTROCE_ADDR1) -- rxe1
#
# Both addresses are local to the guest, so by default the kernel routes traffic between
# them through the local table and lo; two rxe devices then fail with "Failed to modify QP
# to RTR", or rdma_cm quietly connects rxe1 to itself, because the route to the peer does
# not leave through the rxe netdev. Policy routing fixes that: packets that arrived on a
# veth end are delivered by the local table (rules 10, 11); every other lookup for one of
# the two addresses (sockets, rxe, and rdma_cm's route checks, which look up with no input
# interface at all, so an "iif lo" rule would miss them) uses a table that sends it out of
# the other end of the veth pair (rules 100, 101); the local table moves behind them.
# accept_local/rp_filter let the receiving end accept a source address that is local too.
#
# Writes the settings to /run/softroce.env (sourced by init, usable by payloads). The
# guest has no network card (-nic none): none of these packets leave the guest.
set -eu

ADDR0=192.0.2.1
ADDR1=192.0.2.2

for m in veth crc32_generic rdma_rxe ib_uverbs rdma_ucm; do
    modprobe "$m"
done
# Optional: the accelerated crc32 needs PCLMULQDQ, which the emulated CPU may lack.
modprobe crc32-pclmul 2>/dev/null || true

sysctl_set() { echo "$2" >"/proc/sys/$1"; }

# RDMA READ responses come in bursts; veth hands packets to the peer's backlog queue.
sysctl_set net/core/netdev_max_backlog 250000
sysctl_set net/core/rmem_max 16777216
sysctl_set net/core/wmem_max 16777216

ip link set lo up
ip link add veth0 type veth peer name veth1
for dev in veth0 veth1; do
    sysctl_set "net/ipv6/conf/$dev/disable_ipv6" 1
    ip link set "$dev" mtu 4500 || true
    ip link set "$dev" up
done
for conf in all default veth0 veth1; do
    sysctl_set "net/ipv4/conf/$conf/accept_local" 1
    sysctl_set "net/ipv4/conf/$conf/rp_filter" 0
done
ip addr add "$ADDR0/32" dev veth0
ip addr add "$ADDR1/32" dev veth1

ip route add "$ADDR1/32" dev veth0 src "$ADDR0" table 100
ip route add "$ADDR0/32" dev veth1 src "$ADDR1" table 101
ip rule add pref 10 iif veth0 lookup local
ip rule add pref 11 iif veth1 lookup local
ip rule add pref 100 to "$ADDR1/32" lookup 100
ip rule add pref 101 to "$ADDR0/32" lookup 101
ip rule add pref 1000 lookup local
ip rule del pref 0 lookup local

# Static neighbours: no ARP round trip needed between the two local addresses.
MAC0=$(cat /sys/class/net/veth0/address)
MAC1=$(cat /sys/class/net/veth1/address)
ip neigh replace "$ADDR1" lladdr "$MAC1" dev veth0 nud permanent
ip neigh replace "$ADDR0" lladdr "$MAC0" dev veth1 nud permanent

rdma link add rxe0 type rxe netdev veth0
rdma link add rxe1 type rxe netdev veth1

# GID index of an rxe device's IPv4-mapped RoCE v2 GID (::ffff:a.b.c.d).
gid_index() {
    # shellcheck disable=SC2046,SC2183 # the four octets are split on purpose
    want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' $(echo "$2" | tr . ' '))
    tries=0
    while [ "$tries" -lt 50 ]; do
        for f in /sys/class/infiniband/"$1"/ports/1/gids/*; do
            if [ "$(cat "$f" 2>/dev/null)" = "$want" ]; then
                basename "$f"
                return 0
            fi
        done
        tries=$((tries + 1))
        sleep 0.1
    done
    echo "softroce-guest: no GID $want on $1" >&2
    return 1
}
GID0=$(gid_index rxe0 "$ADDR0")
GID1=$(gid_index rxe1 "$ADDR1")

cat >/run/softroce.env <<EOF
export SOFTROCE_DEV0=rxe0 SOFTROCE_DEV1=rxe1
export SOFTROCE_NETDEV0=veth0 SOFTROCE_NETDEV1=veth1
export SOFTROCE_ADDR0=$ADDR0 SOFTROCE_ADDR1=$ADDR1
export SOFTROCE_GID0=$GID0 SOFTROCE_GID1=$GID1
EOF

echo "softroce-guest: rxe0 on veth0 $ADDR0 (gid $GID0), rxe1 on veth1 $ADDR1 (gid $GID1)"
rdma link show
ip rule show
