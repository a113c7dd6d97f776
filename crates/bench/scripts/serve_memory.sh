#!/usr/bin/env bash
# The memory of `warden serve` around big replies: its RSS at start, then
# after each of TURNS turns (each a reply of N deltas of SIZE bytes from a
# hostile upstream, on its own session) once the turn's events have expired
# and its session has been reaped. Run twice in one go: with warden's
# allocator tuning (mimalloc returning freed memory after 10 ms) and with
# mimalloc's default (MIMALLOC_PURGE_DELAY=1000), the baseline.
#
# usage: serve_memory.sh [BIN] [N] [SIZE] [TURNS]
#        (default: target/release/warden 100000 100 4: 10 MB replies)
set -euo pipefail
BIN=${1:-target/release/warden}; N=${2:-100000}; SIZE=${3:-100}; TURNS=${4:-4}
HERE="$(cd "$(dirname "$0")" && pwd)"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

run() {
    local label=$1; shift
    local up_port serve_port dir up serve token
    up_port=$(free_port); serve_port=$(free_port); dir=$(mktemp -d)
    python3 "$HERE/hostile_upstream.py" "$up_port" "$N" "$SIZE" & up=$!
    env "$@" "$BIN" serve --listen "127.0.0.1:$serve_port" --data-dir "$dir" \
        --base-url "http://127.0.0.1:$up_port" --keep-events 2s --idle-timeout 1s \
        >"$dir/out" 2>"$dir/err" & serve=$!
    for _ in $(seq 1 100); do [ -s "$dir/token" ] && grep -q listening "$dir/out" && break; sleep 0.1; done
    rss() { awk '/VmRSS/ {print $2}' "/proc/$serve/status"; }
    token=$(cat "$dir/token")
    local start; start=$(rss)
    local line="$label: start ${start} KB"
    for t in $(seq 1 "$TURNS"); do
        curl -s -o /dev/null -X POST "http://127.0.0.1:$serve_port/v1/turns" \
            -H "authorization: Bearer $token" -H 'content-type: application/json' \
            -H 'accept: text/event-stream' -d "{\"key\":\"k$t\",\"message\":\"hi\"}"
        sleep 3.5 # the events expire (2 s) and the session is reaped (1 s)
        line="$line; after turn $t +$(( $(rss) - start )) KB"
    done
    echo "$line"
    kill "$serve" "$up"; wait 2>/dev/null || true; rm -rf "$dir"
}

echo "== warden serve RSS after $TURNS replies of $N x $SIZE bytes, events expired, sessions reaped"
run "tuned (purge after 10 ms)"
run "baseline (mimalloc default)" MIMALLOC_PURGE_DELAY=1000
