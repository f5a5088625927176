#!/usr/bin/env bash
# Runs an Idem cluster of N nodes on this machine (loopback), for trying
# clusters out and for benchmarks.
#
#   scripts/local-cluster.sh start [N]   start N nodes (default 3)
#   scripts/local-cluster.sh stop        stop them (SIGTERM, then wait)
#   scripts/local-cluster.sh status      show each node's role and address
#
# Node i listens for clients on 127.0.0.1:$((BASE_PORT + i)) and for peers
# on 127.0.0.1:$((PEER_BASE_PORT + i)); its data directory, log and pid
# file are under $DIR/node$i. Environment:
#   DIR             where the nodes live (default ./idem-cluster)
#   BASE_PORT       client ports start after it (default 7100)
#   PEER_BASE_PORT  peer ports start after it (default 17100)
#   IDEMD           the idemd binary (default target/release/idemd of the
#                   repository this script is in, built with cargo if
#                   missing)
#   IDEM_WORKER_THREADS  each node's worker threads (default 1: the nodes
#                   share this machine's CPUs, and each serves from one
#                   event loop, as a Redis node does; README, Running idemd)
# Starting again after a stop restarts the same nodes on their data (N is
# then read from what is there).
set -euo pipefail

DIR=${DIR:-./idem-cluster}
BASE_PORT=${BASE_PORT:-7100}
PEER_BASE_PORT=${PEER_BASE_PORT:-17100}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IDEMD=${IDEMD:-$ROOT/target/release/idemd}

nodes_present() {
    local n=0
    while [ -d "$DIR/node$((n + 1))" ]; do n=$((n + 1)); done
    echo "$n"
}

start() {
    local n=${1:-}
    local present
    present=$(nodes_present)
    if [ -z "$n" ]; then
        n=$present
        [ "$n" -gt 0 ] || n=3
    elif [ "$present" -gt 0 ] && [ "$present" != "$n" ]; then
        echo "$DIR holds $present nodes; stop and remove it to start $n" >&2
        exit 2
    fi
    if [ ! -x "$IDEMD" ]; then
        echo "building $IDEMD (cargo build --release --bin idemd)"
        (cd "$ROOT" && cargo build --release --bin idemd)
    fi
    local initial=""
    for i in $(seq 1 "$n"); do
        initial="${initial:+$initial,}$i=127.0.0.1:$((PEER_BASE_PORT + i))"
    done
    for i in $(seq 1 "$n"); do
        local d="$DIR/node$i"
        mkdir -p "$d"
        if [ -f "$d/pid" ] && kill -0 "$(cat "$d/pid")" 2>/dev/null; then
            echo "node $i already runs (pid $(cat "$d/pid"))"
            continue
        fi
        IDEM_WORKER_THREADS=${IDEM_WORKER_THREADS:-1} "$IDEMD" --node-id "$i" \
            --listen "127.0.0.1:$((BASE_PORT + i))" \
            --peer-listen "127.0.0.1:$((PEER_BASE_PORT + i))" \
            --data-dir "$d/data" \
            --initial-cluster "$initial" \
            >>"$d/idemd.log" 2>&1 &
        echo $! >"$d/pid"
    done
    # Wait until a leader serves (at most 30 s).
    for _ in $(seq 1 300); do
        if status quiet; then
            # The leader may change between the two looks (an election
            # right after a restart): the listing then says so, and the
            # cluster is up all the same.
            status || true
            return 0
        fi
        sleep 0.1
    done
    status || true
    echo "no leader after 30 s: see $DIR/node*/idemd.log" >&2
    exit 1
}

# The CLUSTER INFO field $2 of the node on port $1 (empty if unreachable).
field() {
    redis-cli -p "$1" CLUSTER INFO 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}

status() {
    local n leader="" up=0
    n=$(nodes_present)
    [ "$n" -gt 0 ] || { echo "no nodes in $DIR"; return 1; }
    for i in $(seq 1 "$n"); do
        local port=$((BASE_PORT + i)) role pid="-"
        [ -f "$DIR/node$i/pid" ] && pid=$(cat "$DIR/node$i/pid")
        role=$(field "$port" idem_role || true)
        if [ -n "$role" ]; then
            up=$((up + 1))
            [ "$role" = leader ] && leader=$i
        fi
        [ "${1:-}" = quiet ] || printf 'node %s  client 127.0.0.1:%s  peer 127.0.0.1:%s  pid %s  %s\n' \
            "$i" "$port" "$((PEER_BASE_PORT + i))" "$pid" "${role:-down}"
    done
    if [ -z "$leader" ]; then
        [ "${1:-}" = quiet ] || echo "no leader: $up of $n nodes answer (an election may be running; see $DIR/node*/idemd.log)"
        return 1
    fi
    [ "${1:-}" = quiet ] && return 0
    local seeds=""
    for i in $(seq 1 "$n"); do seeds="${seeds:+$seeds,}127.0.0.1:$((BASE_PORT + i))"; done
    echo "leader: node $leader; clients: redis-cli -c -p $((BASE_PORT + leader)), idem-client seeds \"$seeds\""
}

stop() {
    local n
    n=$(nodes_present)
    for i in $(seq 1 "$n"); do
        local f="$DIR/node$i/pid"
        if [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; then
            kill -TERM "$(cat "$f")"
        fi
    done
    for i in $(seq 1 "$n"); do
        local f="$DIR/node$i/pid"
        if [ -f "$f" ]; then
            local pid
            pid=$(cat "$f")
            for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            rm -f "$f"
        fi
    done
    echo "stopped $n nodes (data kept in $DIR)"
}

case "${1:-}" in
    start) start "${2:-}" ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start [N] | stop | status" >&2; exit 2 ;;
esac
