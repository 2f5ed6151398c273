#!/usr/bin/env bash
# A Sluice cluster on one machine, one network namespace per node (docs/deploy.md):
#
#   etcd, a served state store and the controller in the host's namespace on a bridge
#   (10.77.0.1), and N nodes (default 3), each in its own namespace (sl-node1 ... with
#   10.77.0.11 ...), registering in etcd over the bridge and checking the store. Once the
#   controller has placed the chain, the nodes run it together (`sluice node --run`): the
#   root's node reads the input (default traces/demo.pcap at a thousandth of its recorded
#   pace, about two minutes), the NFs' state is in the served store, fault tolerance is on.
#
# Usage (as root):
#   scripts/cluster-netns.sh up [--nodes N] [--chain chains/example.yaml] [--input PCAP] [--pace X]
#   scripts/cluster-netns.sh status          # sluice cluster status (leader, nodes, units)
#   scripts/cluster-netns.sh kill-node I     # SIGKILL node I (its units are re-placed)
#   scripts/cluster-netns.sh down            # stop everything, remove namespaces and bridge
#
# Environment: SLUICE (the binary; default target/release/sluice), STATE (default
# /tmp/sluice-cluster-netns: pids, logs, etcd data, the store token), CLUSTER (default demo).
# What runs is what a deployment runs; only the addresses are made up. A node killed while the
# chain runs is failed over by the root's node; the root's node killed ends the run (the input
# and the root's log live there; docs/deploy.md says what is missing).
set -euo pipefail

cd "$(dirname "$0")/.."
SLUICE=${SLUICE:-$PWD/target/release/sluice}
STATE=${STATE:-/tmp/sluice-cluster-netns}
CLUSTER=${CLUSTER:-demo}
BR=slbr0
HOST_IP=10.77.0.1
ETCD=http://$HOST_IP:23790
STORE_PORT=7600

die() { echo "cluster-netns: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"; }
node_ip() { echo "10.77.0.$((10 + $1))"; }

# Starts "$@" in the background with its output in $STATE/$name.log and its pid in $STATE/$name.pid.
start() {
    local name=$1; shift
    "$@" >"$STATE/$name.log" 2>&1 &
    echo $! >"$STATE/$name.pid"
}

wait_for() { # what, seconds, command...
    local what=$1 secs=$2; shift 2
    for _ in $(seq $((secs * 10))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    die "$what did not come up within ${secs}s (logs in $STATE)"
}

up() {
    local nodes=3 chain=chains/example.yaml input=traces/demo.pcap pace=0.001
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) nodes=$2; shift 2 ;;
            --chain) chain=$2; shift 2 ;;
            --input) input=$2; shift 2 ;;
            --pace) pace=$2; shift 2 ;;
            *) die "unknown option $1 (up [--nodes N] [--chain C] [--input PCAP] [--pace X])" ;;
        esac
    done
    [ -f "$input" ] || die "no input file $input"
    input=$(realpath "$input")
    [[ "$nodes" =~ ^[1-9][0-9]?$ ]] && [ "$nodes" -le 50 ] || die "--nodes takes 1 to 50, not $nodes"
    [ -x "$SLUICE" ] || die "no sluice binary at $SLUICE (cargo build --release -p sluice-cli, or set SLUICE)"
    [ -f "$chain" ] || die "no chain file $chain"
    command -v etcd >/dev/null || die "etcd is not installed (apt-get install etcd-server)"
    [ -e "$STATE/etcd.pid" ] && die "already up (state in $STATE): run down first"
    mkdir -p "$STATE"
    echo "$nodes" >"$STATE/nodes"
    head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$STATE/store.token"
    local token; token=$(cat "$STATE/store.token")

    ip link add "$BR" type bridge
    ip addr add "$HOST_IP/24" dev "$BR"
    ip link set "$BR" up
    for i in $(seq "$nodes"); do
        ip netns add "sl-node$i"
        ip link add "sl-n$i" type veth peer name eth0 netns "sl-node$i"
        ip link set "sl-n$i" master "$BR" up
        ip -n "sl-node$i" addr add "$(node_ip "$i")/24" dev eth0
        ip -n "sl-node$i" link set eth0 up
        ip -n "sl-node$i" link set lo up
    done

    start etcd etcd --name sl-etcd --data-dir "$STATE/etcd" \
        --listen-client-urls "$ETCD,http://127.0.0.1:23790" --advertise-client-urls "$ETCD" \
        --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
        --initial-cluster sl-etcd=http://127.0.0.1:23800
    wait_for etcd 20 "$SLUICE" cluster --etcd "$ETCD" --cluster "$CLUSTER" status
    echo "$token" >"$STATE/token-file"
    start store "$SLUICE" store serve --listen "$HOST_IP:$STORE_PORT" --token-file "$STATE/token-file" \
        --control 9479 --control-token "$token"
    wait_for "the store" 10 grep -q "serving" "$STATE/store.log"
    local store_url="sluice://$HOST_IP:$STORE_PORT?token=$token&space=$CLUSTER"
    chain=$(realpath "$chain")
    for i in $(seq "$nodes"); do
        # Every node runs its part with the same options; the root's node adds the input.
        start "node$i" ip netns exec "sl-node$i" "$SLUICE" node --etcd "$ETCD" --cluster "$CLUSTER" \
            --id "node$i" --addr "$(node_ip "$i"):6081" --ttl 2 --store "$store_url" \
            --control "$(node_ip "$i"):9480" --control-token "$token" \
            --run="--chain $chain --fault-tolerance --store $store_url --workers 1" \
            --root-run="--input $input --pace $pace --json $STATE/report.json"
    done
    wait_for "$nodes nodes" 30 sh -c "'$SLUICE' cluster --etcd '$ETCD' --cluster '$CLUSTER' status --json | grep -o '\"id\"' | wc -l | grep -qx '$nodes'"
    # The controller once every node has joined: it places what it has to place on the nodes
    # live at that moment, and a node that joins later gets nothing of a placement already
    # made (nothing moves without a reason) — started first, it put the whole chain on
    # whichever node registered first when the others were slow to start.
    start controller "$SLUICE" controller --etcd "$ETCD" --cluster "$CLUSTER" --chain "$chain" \
        --roots 1 --ttl 2 --control 9470 --control-token "$token"
    echo "up: etcd $ETCD, store sluice://$HOST_IP:$STORE_PORT, controller metrics 127.0.0.1:9470, $nodes nodes in sl-node1..$nodes"
    echo "control token (also the store's): $token"
}

status() {
    [ -e "$STATE/etcd.pid" ] || die "not up"
    "$SLUICE" cluster --etcd "$ETCD" --cluster "$CLUSTER" status "$@"
}

kill_node() {
    local i=${1:-}
    [[ "$i" =~ ^[0-9]+$ ]] && [ -e "$STATE/node$i.pid" ] || die "no node $i (kill-node I)"
    # The pid is `ip netns exec`'s, which execs sluice: the same process.
    kill -9 "$(cat "$STATE/node$i.pid")" 2>/dev/null || true
    rm -f "$STATE/node$i.pid"
    echo "node$i killed"
}

down() {
    for f in "$STATE"/*.pid; do
        [ -e "$f" ] || continue
        kill "$(cat "$f")" 2>/dev/null || true
    done
    sleep 0.5
    for f in "$STATE"/*.pid; do
        [ -e "$f" ] || continue
        kill -9 "$(cat "$f")" 2>/dev/null || true
        rm -f "$f"
    done
    local nodes; nodes=$(cat "$STATE/nodes" 2>/dev/null || echo 0)
    for i in $(seq "$nodes"); do
        ip netns del "sl-node$i" 2>/dev/null || true
        ip link del "sl-n$i" 2>/dev/null || true
    done
    ip link del "$BR" 2>/dev/null || true
    rm -rf "$STATE"
    echo "down"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
    up) need_root; up "$@" ;;
    status) status "$@" ;;
    kill-node) kill_node "$@" ;;
    down) need_root; down ;;
    *) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
