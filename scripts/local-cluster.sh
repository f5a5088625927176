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
    local initial="" launched=()
    for i in $(seq 1 "$n"); do
        initial="${initial:+$initial,}$i=127.0.0.1:$((PEER_BASE_PORT + i))"
    done
    for i in $(seq 1 "$n"); do
        local d="$DIR/node$i"
        mkdir -p "$d"
        if [ -f "$d/pid" ] && alive "$(cat "$d/pid")"; then
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
        launched+=("$!")
    done
    # Wait until a leader serves (at most 30 s). A node that exits (its
    # ports taken, say) fails the start at once.
    for _ in $(seq 1 300); do
        for i in $(seq 1 "$n"); do
            if ! running "$i"; then
                echo "node $i exited; the end of $DIR/node$i/idemd.log:" >&2
                tail -n 5 "$DIR/node$i/idemd.log" >&2
                # The others this start launched go too: a cluster short
                # of a node is not what was asked for.
                local pid
                for pid in "${launched[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
                for pid in "${launched[@]}"; do
                    for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
                done
                status >&2 || true
                exit 1
            fi
        done
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

# Whether process $1 lives: exists and has not exited (an exited one
# stays a zombie until its parent, init here, reaps it).
alive() {
    kill -0 "$1" 2>/dev/null || return 1
    local _pid _comm state=""
    [ -r "/proc/$1/stat" ] && read -r _pid _comm state _ <"/proc/$1/stat"
    [ "$state" != Z ]
}

# Whether node $1's process runs.
running() {
    local f="$DIR/node$1/pid"
    [ -f "$f" ] && alive "$(cat "$f")"
}

# The pid of the process answering on port $1 (empty if none).
answering_pid() {
    redis-cli -p "$1" INFO server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p'
}

status() {
    local n leader="" up=0 alive=0
    n=$(nodes_present)
    [ "$n" -gt 0 ] || { echo "no nodes in $DIR"; return 1; }
    for i in $(seq 1 "$n"); do
        local port=$((BASE_PORT + i)) role="" pid="-" state
        if running "$i"; then
            alive=$((alive + 1))
            pid=$(cat "$DIR/node$i/pid")
            # Only what this node's own process answers counts: another
            # process on its port (another cluster's node) is not it.
            local other
            other=$(answering_pid "$port" || true)
            if [ -n "$other" ] && [ "$other" != "$pid" ]; then
                state="not answering: port $port is held by pid $other"
            else
                role=$(field "$port" idem_role || true)
                state=${role:-not answering}
            fi
        else
            state="stopped"
        fi
        if [ -n "$role" ]; then
            up=$((up + 1))
            [ "$role" = leader ] && leader=$i
        fi
        [ "${1:-}" = quiet ] || printf 'node %s  client 127.0.0.1:%s  peer 127.0.0.1:%s  pid %s  %s\n' \
            "$i" "$port" "$((PEER_BASE_PORT + i))" "$pid" "$state"
    done
    if [ -z "$leader" ]; then
        if [ "${1:-}" != quiet ]; then
            if [ "$alive" -eq 0 ]; then
                echo "no node runs (data kept in $DIR; start again with: DIR=$DIR BASE_PORT=$BASE_PORT PEER_BASE_PORT=$PEER_BASE_PORT $0 start)"
            else
                echo "no leader: $up of $n nodes answer (an election may be running; see $DIR/node*/idemd.log)"
            fi
        fi
        return 1
    fi
    [ "${1:-}" = quiet ] && return 0
    local seeds=""
    for i in $(seq 1 "$n"); do seeds="${seeds:+$seeds,}127.0.0.1:$((BASE_PORT + i))"; done
    echo "leader: node $leader; clients: redis-cli -c -p $((BASE_PORT + leader)), idem-client seeds \"$seeds\""
}

stop() {
    local n stopped=0
    n=$(nodes_present)
    for i in $(seq 1 "$n"); do
        if running "$i"; then
            kill -TERM "$(cat "$DIR/node$i/pid")"
            stopped=$((stopped + 1))
        fi
    done
    for i in $(seq 1 "$n"); do
        local f="$DIR/node$i/pid"
        if [ -f "$f" ]; then
            local pid
            pid=$(cat "$f")
            for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
            rm -f "$f"
        fi
    done
    if [ "$stopped" -eq 0 ]; then
        echo "no node was running (data kept in $DIR)"
    else
        echo "stopped $stopped of $n nodes (data kept in $DIR)"
    fi
}

case "${1:-}" in
    start) start "${2:-}" ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start [N] | stop | status" >&2; exit 2 ;;
esac
