#!/usr/bin/env bash
# Test environment for the Redis store backend (crates/sluice-redis), on loopback only:
# one redis-server on 127.0.0.1:6390 and a Redis Cluster of three primaries (127.0.0.1:7390-7392)
# with one replica each (7393-7395), with their data and logs in DIR.
#
#   scripts/redis-env.sh start DIR   # installs redis-server/redis-tools with apt if missing
#   scripts/redis-env.sh stop DIR
#
# Then: SLUICE_REDIS_URL=redis://127.0.0.1:6390
#       SLUICE_REDIS_CLUSTER_URL=redis+cluster://127.0.0.1:7390,127.0.0.1:7391,127.0.0.1:7392
#
# REDIS_ENV_PORT (6390) and REDIS_ENV_CLUSTER_PORT (7390, the first of six) choose other ports,
# for a second environment beside the first (scripts/test-all.sh starts one per test lane).
set -euo pipefail

cmd="${1:-}"
dir="${2:-}"
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi

SINGLE="${REDIS_ENV_PORT:-6390}"
first="${REDIS_ENV_CLUSTER_PORT:-7390}"
CLUSTER=()
for i in 0 1 2 3 4 5; do CLUSTER+=($((first + i))); done

ensure_redis() {
  if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    return
  fi
  echo "== installing redis-server redis-tools"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
}

wait_ping() {
  local port=$1
  for _ in $(seq 1 100); do
    if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
      return 0
    fi
    sleep 0.1
  done
  echo "redis on port $port did not start; see $dir/$port/redis.log" >&2
  return 1
}

# redis_has PORT "COMMAND ARGS" PATTERN: whether the node's answer matches.
redis_has() {
  # shellcheck disable=SC2086
  redis-cli -h 127.0.0.1 -p "$1" $2 2>/dev/null | grep -q "$3"
}

# wait_for WHAT TRIES CHECK...: runs CHECK every 0.1 s until it succeeds, at most TRIES times.
wait_for() {
  local what=$1 tries=$2
  shift 2
  for _ in $(seq 1 "$tries"); do
    "$@" && return 0
    sleep 0.1
  done
  echo "timed out waiting for $what" >&2
  exit 1
}

start_one() {
  local port=$1
  shift
  mkdir -p "$dir/$port"
  # No persistence: the environment is for tests and benchmarks.
  redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes --dir "$dir/$port" \
    --daemonize yes --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log" \
    --save "" --appendonly no "$@"
  wait_ping "$port"
}

case "$cmd" in
  start)
    ensure_redis
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    start_one "$SINGLE"
    for p in "${CLUSTER[@]}"; do
      # A fresh cluster every start: a node that finds the configuration or the data of an
      # earlier one (a DIR used before; a replica keeps the snapshot its primary sent it) comes
      # back with them, and creating the cluster then fails ("not empty").
      rm -f "$dir/$p/nodes.conf" "$dir/$p/dump.rdb"
      start_one "$p" --cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf" --cluster-node-timeout 5000
    done
    nodes=()
    for p in "${CLUSTER[@]}"; do nodes+=("127.0.0.1:$p"); done
    # With every node on one host, redis-cli makes the first three the primaries.
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$dir/cluster-create.log" 2>&1 || {
      cat "$dir/cluster-create.log" >&2
      exit 1
    }
    # Ready when every node sees a healthy cluster with all slots assigned, and every
    # primary's replica is in sync.
    for p in "${CLUSTER[@]}"; do
      wait_for "cluster node $p ready" 100 redis_has "$p" "cluster info" "cluster_state:ok"
    done
    for p in "${CLUSTER[@]}"; do
      redis_has "$p" "info replication" "role:master" || continue
      wait_for "the replica of cluster primary $p in sync" 200 redis_has "$p" "info replication" "slave0:.*state=online"
    done
    echo "redis ready: redis://127.0.0.1:$SINGLE and redis+cluster://127.0.0.1:${CLUSTER[0]},127.0.0.1:${CLUSTER[1]},127.0.0.1:${CLUSTER[2]}"
    ;;
  stop)
    # Every server started in DIR, whatever its ports.
    for pidfile in "$dir"/*/redis.pid; do
      p="$(basename "$(dirname "$pidfile")")"
      if [ -f "$pidfile" ]; then
        pid="$(cat "$pidfile")"
        redis-cli -h 127.0.0.1 -p "$p" shutdown nosave >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
          kill -0 "$pid" 2>/dev/null || break
          sleep 0.1
        done
        rm -f "$pidfile"
      fi
    done
    ;;
  *)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
