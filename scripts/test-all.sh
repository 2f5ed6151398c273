#!/usr/bin/env bash
# Runs Sluice's whole test suite on a fresh Debian machine with the Rust toolchain, installing
# what the tests need first: tcpdump (reads our pcap output), iproute2, iputils-ping, ethtool and
# python3 (real network namespaces, veth pairs, a ping and an HTTP download through a chain),
# nftables (drops datagrams between node processes at random, for the loss test),
# redis-server (a single server and a 3-node cluster on loopback for the Redis store), and
# etcd-server (crates/sluice-cluster starts its own etcd members on free loopback ports).
# The namespace tests need root. The tests run through scripts/run-tests.py: built once, then
# in two lanes side by side. Usage: scripts/test-all.sh [args for every test binary, e.g. a filter]
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing: ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --quiet -- -D warnings
# Test scratch (the netns tests record tens of thousands of full-size packets per run, stores
# keep their files) goes to RAM when /dev/shm has 8 GiB free: a CI machine's disk can be nearly
# full, and a run once failed there with "No space left on device" while recording.
scratch=""
shm_free_kib="$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}' || true)"
if [ "${shm_free_kib:-0}" -gt $((8 * 1024 * 1024)) ]; then
  scratch="$(mktemp -d /dev/shm/sluice-tests.XXXXXX)"
  export TMPDIR="$scratch"
  echo "== test scratch in $scratch (RAM)"
fi
echo "== redis test servers (crates/sluice-redis), one set per test lane"
redis_dir="$(mktemp -d)"
trap 'scripts/redis-env.sh stop "$redis_dir" || true; rm -rf "$redis_dir"; [ -z "$scratch" ] || rm -rf "$scratch"' EXIT
scripts/redis-env.sh start "$redis_dir"  # installs redis-server and redis-tools if missing
REDIS_ENV_PORT=6490 REDIS_ENV_CLUSTER_PORT=7490 scripts/redis-env.sh start "$redis_dir"
export SLUICE_REDIS_URL=redis://127.0.0.1:6390
export SLUICE_REDIS_CLUSTER_URL=redis+cluster://127.0.0.1:7390,127.0.0.1:7391,127.0.0.1:7392
# The second lane's (scripts/run-tests.py): a long script one lane's test runs on its server
# must not make the other lane's clients wait.
export OTHER_LANE_SLUICE_REDIS_URL=redis://127.0.0.1:6490
export OTHER_LANE_SLUICE_REDIS_CLUSTER_URL=redis+cluster://127.0.0.1:7490,127.0.0.1:7491,127.0.0.1:7492
# The random Redis schedules run alone after both lanes and spread their runs over both servers.
export SLUICE_REDIS_MORE_URLS=redis://127.0.0.1:6490
export OTHER_LANE_SLUICE_REDIS_MORE_URLS=
echo "== tests"
scripts/run-tests.py "$@"
