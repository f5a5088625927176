#!/usr/bin/env bash
# Idem vs Redis in one run: starts redis-server and idemd (release build) on
# free loopback ports, runs every workload at 1 and 50 connections with
# pipeline 1 and 16, the herd (1,000 waiters) and the memory load (1M
# completed records, 32-byte keys, 64-byte values) with neither side
# durable (idemd --engine memory, Redis without persistence); then, durable
# against durable (idemd's default raft engine, Redis with appendonly yes
# and appendfsync always), claims and claim+complete cycles at 50
# connections, pipeline 1 and 16; then how fast each side restarts from its
# log; then replicated (a three-node idemd cluster against Redis AOF-always
# and against a Redis primary and replica with WAIT 1 0), and the failover
# time; the replicated claims are also driven by redis-benchmark. Prints
# the tables and cleans up.
#
#   bash benches/compare.sh [extra idem-bench flags]
#
# Environment: ONLY=cluster (run section 5 alone), DURATION (seconds per
# measurement, default 5), ROUNDS (the durable and replicated sections:
# idemd and Redis take this many turns of DURATION each and each side's
# turns are pooled, default 3: fsync times on a shared disk drift over
# tens of seconds, and one turn each can land a slow spell on one side),
# IDEM_THREADS (idemd worker threads, default 1: Redis serves from one
# thread, and on a small machine the load generator needs the other core),
# RECORDS (default 1000000), WAITERS (default 1000), JSON (output file),
# ETCD=1 (section 5 also runs the claims against a three-node etcd cluster
# as put-if-absent transactions with a lease; installs etcd-server and
# protobuf-compiler if missing and builds idem-bench with its etcd
# feature), SLOW_FAILOVER_MS (default 2000: a failover that takes longer
# keeps the nodes' logs and what each try got under target/),
# FAILOVER_GIVE_UP_S (default 60: with no write acknowledged that long
# after a kill, the logs are kept and the run stops).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
IDEM_THREADS=${IDEM_THREADS:-1}
RECORDS=${RECORDS:-1000000}
WAITERS=${WAITERS:-1000}
JSON=${JSON:-target/compare.json}

if ! command -v redis-server >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get install -y redis-server redis-tools || { $SUDO apt-get update && $SUDO apt-get install -y redis-server redis-tools; }
fi
BENCH_FEATURES=()
if [ "${ETCD:-0}" = 1 ]; then
  if ! command -v etcd >/dev/null || ! command -v protoc >/dev/null; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get install -y etcd-server protobuf-compiler \
      || { $SUDO apt-get update && $SUDO apt-get install -y etcd-server protobuf-compiler; }
  fi
  BENCH_FEATURES=(--features idem-benches/etcd)
fi
cargo build --release --bin idemd --bin idem-bench ${BENCH_FEATURES[@]+"${BENCH_FEATURES[@]}"}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
until_ping() { # port -> seconds until it answers PING
  python3 - "$1" <<'PY'
import socket, sys, time
t0 = time.monotonic()
while True:
    try:
        with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60) as s:
            s.sendall(b"PING\r\n")
            if s.recv(64).startswith(b"+PONG"):
                break
    except OSError:
        pass
    time.sleep(0.005)
print(f"{time.monotonic() - t0:.3f}")
PY
}
WORK=$(mktemp -d)
stop_servers() {
  [ -n "${IDEM_PID:-}" ] && kill "$IDEM_PID" 2>/dev/null && wait "$IDEM_PID" 2>/dev/null || true
  [ -n "${REDIS_PID:-}" ] && kill "$REDIS_PID" 2>/dev/null && wait "$REDIS_PID" 2>/dev/null || true
  IDEM_PID=""; REDIS_PID=""
}
# Cluster nodes (idemd, etcd) started in section 5, stopped on any exit.
CLUSTER_PIDS=(); ETCD_PIDS=()
cleanup() {
  stop_servers
  local pids=(${CLUSTER_PIDS[@]+"${CLUSTER_PIDS[@]}"} ${ETCD_PIDS[@]+"${ETCD_PIDS[@]}"})
  for pid in ${pids[@]+"${pids[@]}"}; do kill "$pid" 2>/dev/null || true; done
  for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# Fresh servers on free ports: Redis as people deploy it for this (no
# persistence), idemd with the memory engine.
start_servers() {
  REDIS_PORT=$(free_port)
  IDEM_PORT=$(free_port)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" \
    --maxclients 10000 --daemonize no > "$WORK/redis.log" 2>&1 &
  REDIS_PID=$!
  IDEM_WORKER_THREADS=$IDEM_THREADS IDEM_MAX_MEMORY_BYTES=8589934592 RUST_LOG=warn \
    ./target/release/idemd --listen "127.0.0.1:$IDEM_PORT" --engine memory > "$WORK/idemd.log" 2>&1 &
  IDEM_PID=$!
  for _ in $(seq 50); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && redis-cli -p "$IDEM_PORT" ping >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "servers did not start" >&2; exit 1
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/{print $2}') GiB"
echo "redis: $(redis-server --version | cut -d' ' -f3) (no persistence); idemd: memory engine (no durability), $IDEM_THREADS worker thread(s)"
echo

if [ "${ONLY:-}" != cluster ]; then
# 1. Throughput and latency, then the herd, on fresh servers.
start_servers
./target/release/idem-bench --idem "127.0.0.1:$IDEM_PORT" --redis "127.0.0.1:$REDIS_PORT" \
  --workloads ping,claim,cycle,replay,mixed --connections 1,50 --pipeline 1,16 \
  --duration "$DURATION" --herd "$WAITERS" --json "$JSON" "$@"
stop_servers

# 2. Resident memory per completed record, on fresh servers.
start_servers
./target/release/idem-bench --idem "127.0.0.1:$IDEM_PORT" --redis "127.0.0.1:$REDIS_PORT" \
  --no-throughput --memory "$RECORDS" --json "${JSON%.json}-memory.json"
stop_servers
# 3. Durable against durable, on fresh servers: every acknowledged write is
# fsynced on both sides.
REDIS_PORT=$(free_port)
IDEM_PORT=$(free_port)
mkdir -p "$WORK/redis-aof" "$WORK/idem-data"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always \
  --dir "$WORK/redis-aof" --maxclients 10000 --daemonize no > "$WORK/redis.log" 2>&1 &
REDIS_PID=$!
IDEM_WORKER_THREADS=$IDEM_THREADS IDEM_MAX_MEMORY_BYTES=8589934592 RUST_LOG=warn \
  ./target/release/idemd --listen "127.0.0.1:$IDEM_PORT" --engine raft --data-dir "$WORK/idem-data" \
  > "$WORK/idemd.log" 2>&1 &
IDEM_PID=$!
for _ in $(seq 100); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && redis-cli -p "$IDEM_PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done
echo
echo "durable: idemd raft engine (fdatasync per log entry, group commit) vs redis appendonly yes, appendfsync always"
./target/release/idem-bench --idem "127.0.0.1:$IDEM_PORT" --redis "127.0.0.1:$REDIS_PORT" \
  --workloads ping,claim,cycle --connections 50 --pipeline 1,16 \
  --duration "$DURATION" --rounds "$ROUNDS" --json "${JSON%.json}-durable.json" "$@"
redis-cli -p "$IDEM_PORT" info persistence | tr -d '\r' | grep -E 'wal_' || true
stop_servers

# 4. Restart: how fast each side replays its log. idemd with snapshots off
# (so every write is replayed from the log), Redis from the AOF written in 3.
echo
echo "restart: log replay (idemd snapshots off; redis AOF from the durable run)"
IDEM_PORT=$(free_port)
REPLAY_ENV="IDEM_WORKER_THREADS=$IDEM_THREADS IDEM_MAX_MEMORY_BYTES=8589934592 IDEM_SNAPSHOT_ENTRIES=1000000000 IDEM_SNAPSHOT_LOG_BYTES=1000000000000 RUST_LOG=warn"
start_idem_replay() {
  env $REPLAY_ENV ./target/release/idemd --listen "127.0.0.1:$IDEM_PORT" --data-dir "$WORK/idem-replay" \
    > "$WORK/idemd.log" 2>&1 &
  IDEM_PID=$!
}
start_idem_replay
until_ping "$IDEM_PORT" >/dev/null
./target/release/idem-bench --idem "127.0.0.1:$IDEM_PORT" --workloads claim --connections 50 --pipeline 16 \
  --duration "$DURATION" > /dev/null
CMDS=$(redis-cli -p "$IDEM_PORT" info persistence | tr -d '\r' | awk -F: '/^wal_cmds:/{print $2}')
ENTRIES=$(redis-cli -p "$IDEM_PORT" info persistence | tr -d '\r' | awk -F: '/^wal_entries:/{print $2}')
stop_servers
LOG_MB=$(du -sm "$WORK/idem-replay/log" | cut -f1)
start_idem_replay
SECS=$(until_ping "$IDEM_PORT")
RECS=$(redis-cli -p "$IDEM_PORT" dbsize)
stop_servers
printf 'idemd: %s commands in %s log entries (%s MiB) replayed in %s s: %s commands/s, %s records\n' \
  "$CMDS" "$ENTRIES" "$LOG_MB" "$SECS" "$(python3 -c "print(round($CMDS / $SECS))")" "$RECS"
REDIS_PORT=$(free_port)
AOF_MB=$(du -sm "$WORK/redis-aof" | cut -f1)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always \
  --dir "$WORK/redis-aof" --daemonize no > "$WORK/redis.log" 2>&1 &
REDIS_PID=$!
SECS=$(until_ping "$REDIS_PORT")
KEYS=$(redis-cli -p "$REDIS_PORT" dbsize)
stop_servers
printf 'redis: AOF (%s MiB) loaded in %s s, %s keys\n' "$AOF_MB" "$SECS" "$KEYS"
fi

# 5. Replicated: a three-node idemd cluster on loopback (every node
# fsyncs; a write is acknowledged once a majority has it on disk) against
# Redis with appendfsync always as one node, and against a Redis primary
# with one replica (both appendfsync always) and WAIT 1 0 after each write.
# The three nodes, the two Redis and the load generator share this
# machine's cores.
echo
echo "replicated: three idemd nodes (raft, each fsyncs) vs redis AOF-always (one node) and vs redis primary + replica with WAIT 1 0"
CLUSTER_PIDS=()
declare -A CPORT
INITIAL=""
for i in 1 2 3; do
  CPORT[$i]=$(free_port); PPORT=$(free_port)
  eval "PEER_$i=$PPORT"
  INITIAL="${INITIAL:+$INITIAL,}$i=127.0.0.1:$PPORT"
done
start_node() { # id
  local i=$1 peer_var="PEER_$1"
  # Info level: leadership changes, restarts and snapshots, kept when a
  # failover is slow (below).
  IDEM_WORKER_THREADS=$IDEM_THREADS IDEM_MAX_MEMORY_BYTES=8589934592 RUST_LOG=info,openraft=warn \
    ./target/release/idemd --node-id "$i" --listen "127.0.0.1:${CPORT[$i]}" \
    --peer-listen "127.0.0.1:${!peer_var}" --data-dir "$WORK/cluster/n$i" \
    --initial-cluster "$INITIAL" >> "$WORK/cluster-n$i.log" 2>&1 &
  CLUSTER_PIDS[$i]=$!
}
for i in 1 2 3; do start_node "$i"; done
leader_port() { # -> the client port of the node that leads, once one serves
  for _ in $(seq 300); do
    for i in 1 2 3; do
      if [ "$(redis-cli -p "${CPORT[$i]}" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^idem_role://p')" = leader ] \
         && redis-cli -p "${CPORT[$i]}" inspect probe 2>/dev/null | grep -qv MOVED; then
        echo "${CPORT[$i]}"; return
      fi
    done
    sleep 0.1
  done
  echo "no leader" >&2; exit 1
}
LEADER=$(leader_port)
info_field() { # port field -> its value in CLUSTER INFO (empty if no answer)
  { redis-cli -p "$1" cluster info 2>/dev/null || true; } | tr -d '\r' | sed -n "s/^$2://p"
}
caught_up() { # id -> once that node follows the leader and has applied its commit index
  local target leader leader_id applied follows
  leader=$(leader_port)
  target=$(info_field "$leader" idem_commit_index)
  for _ in $(seq 600); do
    # Its own log may already reach the target at restart: it has caught
    # up only once it also hears from the leader (whichever leads now).
    leader_id=$(info_field "$(leader_port)" idem_node_id)
    follows=$(info_field "${CPORT[$1]}" idem_leader_id)
    applied=$(info_field "${CPORT[$1]}" idem_applied_index)
    [ -n "$applied" ] && [ "$applied" -ge "$target" ] && [ "$follows" = "$leader_id" ] && return
    sleep 0.1
  done
  echo "node $1 did not catch up within 60 s" >&2
}
REDIS_PORT=$(free_port)
mkdir -p "$WORK/redis-one" "$WORK/redis-primary" "$WORK/redis-replica"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always \
  --dir "$WORK/redis-one" --maxclients 10000 --daemonize no > "$WORK/redis.log" 2>&1 &
REDIS_PID=$!
until_ping "$REDIS_PORT" > /dev/null
./target/release/idem-bench --idem "127.0.0.1:$LEADER" --redis "127.0.0.1:$REDIS_PORT" \
  --workloads claim,cycle --connections 50 --pipeline 1,16 --goals replicated \
  --duration "$DURATION" --rounds "$ROUNDS" --json "${JSON%.json}-cluster.json" "$@"
# The same claims driven by redis-benchmark, a generator neither side
# wrote (Idem's CLAIM against Redis's SET NX PX, random keys, 50
# connections): its turns alternate as idem-bench's do, and the ratio is
# of the pooled rates (requests over the time they took).
rb_turn() { # port pipeline requests command... -> "rps p50_ms p99_ms"
  local port=$1 pipe=$2 n=$3; shift 3
  redis-benchmark -p "$port" -c 50 -P "$pipe" -n "$n" -r 1000000000 --csv "$@" 2>/dev/null \
    | tail -1 | tr -d '"' | awk -F, '{print $2, $5, $7}'
}
echo
echo "claims driven by redis-benchmark, 50 connections: Idem (three nodes) against Redis AOF-always"
printf '%-6s %-6s %12s %8s %8s\n' pipe target "ops/s" "p50 ms" "p99 ms"
for pipe in 1 16; do
  n=$(( DURATION * (pipe == 1 ? 50000 : 250000) ))
  rb_rows=""
  for round in $(seq "$ROUNDS"); do
    a=$(rb_turn "$LEADER" "$pipe" "$n" CLAIM "rb:$pipe:$round:__rand_int__" LEASE 60000)
    b=$(rb_turn "$REDIS_PORT" "$pipe" "$n" SET "rb:$pipe:$round:__rand_int__" v NX PX 60000)
    if [ "$(wc -w <<< "$a $b")" != 6 ]; then
      echo "redis-benchmark gave no result at pipeline $pipe, round $round: idem '$a', redis '$b'" >&2
      exit 1
    fi
    printf '%-6s %-6s %12s %8s %8s\n' "$pipe" idem $a "$pipe" redis $b
    rb_rows="$rb_rows $a $b"
  done
  # Every turn is n requests, so the pooled rate is the rates' harmonic mean.
  python3 - $rb_rows <<'PY'
import sys
v = [float(x) for x in sys.argv[1:]]
rows = [v[i:i + 6] for i in range(0, len(v), 6)]
idem = len(rows) / sum(1 / r[0] for r in rows)
redis = len(rows) / sum(1 / r[3] for r in rows)
print(f"       pooled: idem {idem:,.0f} ops/s, redis {redis:,.0f} ops/s, ratio {idem / redis:.2f}")
PY
done
kill "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true; REDIS_PID=""
PRIMARY=$(free_port); REPLICA=$(free_port)
redis-server --port "$PRIMARY" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always \
  --dir "$WORK/redis-primary" --maxclients 10000 --daemonize no > "$WORK/redis-primary.log" 2>&1 &
REDIS_PID=$!
redis-server --port "$REPLICA" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync always \
  --dir "$WORK/redis-replica" --replicaof 127.0.0.1 "$PRIMARY" --daemonize no > "$WORK/redis-replica.log" 2>&1 &
REPLICA_PID=$!
until_ping "$PRIMARY" > /dev/null; until_ping "$REPLICA" > /dev/null
for _ in $(seq 100); do
  redis-cli -p "$PRIMARY" info replication | grep -q 'connected_slaves:1' && break; sleep 0.1
done
./target/release/idem-bench --idem "127.0.0.1:$LEADER" --redis "127.0.0.1:$PRIMARY" --redis-wait 1 \
  --workloads claim,cycle --connections 50 --pipeline 1,16 --goals replicated \
  --duration "$DURATION" --rounds "$ROUNDS" --json "${JSON%.json}-cluster-wait.json" "$@"
kill "$REPLICA_PID" 2>/dev/null; wait "$REPLICA_PID" 2>/dev/null || true
stop_servers
if [ "${ETCD:-0}" = 1 ]; then
  # The same claims against three etcd nodes on loopback (each fsyncs its
  # WAL; a write is acknowledged once a majority has it), the system
  # people use today for replicated locks: a transaction that puts the
  # key with the connection's lease if it was never created (claim), then
  # one that puts the result if the key's revision is still the claim's
  # (complete, fenced by the revision).
  echo
  echo "replicated: three idemd nodes vs three etcd nodes (put-if-absent transaction with a lease)"
  ETCD_ENDPOINTS=""; ETCD_INITIAL=""
  declare -A ECPORT EPPORT
  for i in 1 2 3; do
    ECPORT[$i]=$(free_port); EPPORT[$i]=$(free_port)
    ETCD_INITIAL="${ETCD_INITIAL:+$ETCD_INITIAL,}e$i=http://127.0.0.1:${EPPORT[$i]}"
    ETCD_ENDPOINTS="${ETCD_ENDPOINTS:+$ETCD_ENDPOINTS,}127.0.0.1:${ECPORT[$i]}"
  done
  for i in 1 2 3; do
    etcd --name "e$i" --data-dir "$WORK/etcd/e$i" \
      --listen-client-urls "http://127.0.0.1:${ECPORT[$i]}" --advertise-client-urls "http://127.0.0.1:${ECPORT[$i]}" \
      --listen-peer-urls "http://127.0.0.1:${EPPORT[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${EPPORT[$i]}" \
      --initial-cluster "$ETCD_INITIAL" --initial-cluster-state new --initial-cluster-token idem-compare \
      --logger zap --log-level error > "$WORK/etcd-e$i.log" 2>&1 &
    ETCD_PIDS+=($!)
  done
  # Healthy once the cluster has a leader (a node answers /health).
  python3 - "${ECPORT[1]}" <<'PY' || { echo "etcd did not start: see $WORK/etcd-e*.log" >&2; exit 1; }
import json, sys, time, urllib.request
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=1) as r:
            if json.load(r).get("health") == "true":
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.2)
sys.exit(1)
PY
  LEADER=$(leader_port)
  ./target/release/idem-bench --idem "127.0.0.1:$LEADER" --etcd "$ETCD_ENDPOINTS" \
    --workloads claim,cycle --connections 50 --pipeline 1,16 \
    --duration "$DURATION" --rounds "$ROUNDS" --json "${JSON%.json}-cluster-etcd.json" "$@"
  kill "${ETCD_PIDS[@]}" 2>/dev/null || true
  wait "${ETCD_PIDS[@]}" 2>/dev/null || true
  ETCD_PIDS=()
fi
# Failover: kill -9 the leader, time until a write is acknowledged by the
# new leader (asked of every surviving node in turn), three times.
for round in 1 2 3; do
  LEADER=$(leader_port)
  for i in 1 2 3; do [ "${CPORT[$i]}" = "$LEADER" ] && DEAD=$i; done
  SURVIVORS=""
  for i in 1 2 3; do [ "$i" != "$DEAD" ] && SURVIVORS="$SURVIVORS ${CPORT[$i]}"; done
  echo "round $round: kill -9 node $DEAD at $(date -u +%H:%M:%S.%N)" > "$WORK/failover.trace"
  # In a group whose errors go to the trace: the shell's notice of the
  # killed job ("Killed ...") goes there too, not between the results.
  {
  kill -9 "${CLUSTER_PIDS[$DEAD]}"
  # Exits 3 when the failover took over SLOW_FAILOVER_MS (default 2000),
  # 4 when no write was acknowledged within FAILOVER_GIVE_UP_S (default
  # 60): the nodes' logs and what each try got are then kept under
  # target/ (and the section stops after a 4).
  TOOK=0
  python3 - "${SLOW_FAILOVER_MS:-2000}" "${FAILOVER_GIVE_UP_S:-60}" $SURVIVORS <<'PY' || TOOK=$?
import re, socket, sys, time
t0 = time.monotonic()
n = 0
last = {}
slow_ms = int(sys.argv[1])
give_up_s = float(sys.argv[2])
while True:
    if time.monotonic() - t0 > give_up_s:
        print(f"failover: no write acknowledged within {give_up_s:g} s of the leader's kill")
        sys.exit(4)
    for port in sys.argv[3:]:
        n += 1
        try:
            with socket.create_connection(("127.0.0.1", int(port)), timeout=1) as s:
                s.settimeout(2)
                s.sendall(f"CLAIM failover-{t0}-{n}\r\n".encode())
                got = s.recv(256)
        except OSError as e:
            got = f"{type(e).__name__}: {e}".encode()
        if got.startswith(b"*2\r\n+ACQUIRED"):
            ms = 1000 * (time.monotonic() - t0)
            print(f"failover: leader killed -> first acknowledged write {ms:.0f} ms")
            sys.exit(3 if ms > slow_ms else 0)
        # Each change of answer (a redirect's slot is the key's: left out).
        seen = re.sub(rb"^-MOVED \d+ ", b"-MOVED ", got)
        if last.get(port) != seen:
            print(f"{time.monotonic() - t0:8.3f} s port {port}: {seen[:80]!r}", file=sys.stderr)
            last[port] = seen
    time.sleep(0.005)
PY
  } 2>> "$WORK/failover.trace"
  if [ "$TOOK" = 3 ] || [ "$TOOK" = 4 ]; then
    KEEP="target/compare-slow-failover-$(date -u +%Y%m%dT%H%M%S)"
    mkdir -p "$KEEP" && cp "$WORK"/cluster-n*.log "$WORK/failover.trace" "$KEEP/"
    for i in 1 2 3; do
      { echo "node $i:"; redis-cli -p "${CPORT[$i]}" cluster info 2>&1 || true; } >> "$KEEP/cluster-info.txt"
    done
    echo "failover over ${SLOW_FAILOVER_MS:-2000} ms: the nodes' logs and the tries are kept in $KEEP"
    [ "$TOOK" = 4 ] && exit 4
  elif [ "$TOOK" != 0 ]; then
    cat "$WORK/failover.trace" >&2
    exit "$TOOK"
  fi
  wait "${CLUSTER_PIDS[$DEAD]}" 2>/dev/null || true
  start_node "$DEAD"
  # The next round kills a leader only once the restarted node has caught
  # up (applied what the leader had committed when it came back): else the
  # two survivors may be one node and one still starting, and the time
  # measured would include that node's restart.
  caught_up "$DEAD"
done
for i in 1 2 3; do kill "${CLUSTER_PIDS[$i]}" 2>/dev/null || true; done
for i in 1 2 3; do wait "${CLUSTER_PIDS[$i]}" 2>/dev/null || true; done
echo "JSON: $JSON ${JSON%.json}-memory.json ${JSON%.json}-durable.json ${JSON%.json}-cluster.json ${JSON%.json}-cluster-wait.json$([ "${ETCD:-0}" = 1 ] && echo " ${JSON%.json}-cluster-etcd.json")"
