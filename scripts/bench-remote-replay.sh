#!/usr/bin/env bash
# The Mooncake trace's requests dealt across two kvpaged nodes that share a remote tier (one
# standalone redis-server, a cluster of one), beside the same two nodes without it and beside
# one node with both their capacities: three `kvpaged-bench replay --daemon` runs, a fresh
# daemon (and a fresh Redis) for each, then the three hit fractions and their differences.
#
#   scripts/bench-remote-replay.sh BUILD [TRACE] [BLOCKS_PER_NODE]
#
# BUILD holds kvpaged and kvpaged-bench (scripts/build.sh DIR); TRACE defaults to the
# Mooncake synthetic trace, BLOCKS_PER_NODE to 5000 (the single node gets twice that).  The
# pool is docs/bench.md's: 512-token blocks of 16 KiB, prompts only, ring_poll_us = 0, one
# client per node, opens in trace order (--ordered), so only the sharing differs.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 BUILD [TRACE] [BLOCKS_PER_NODE]" >&2; exit 2; }
build=$(cd "$1" && pwd)
trace=${2:-$(cd "$(dirname "$0")/.." && pwd)/../shared/traces/mooncake/synthetic_trace.jsonl}
blocks=${3:-5000}
command -v redis-server >/dev/null || { echo "$0: redis-server not installed" >&2; exit 77; }
[ -r "$trace" ] || { echo "$0: no trace $trace" >&2; exit 2; }
tmp=$(mktemp -d)
pids=()
rpid=

stop_all() {
	local p

	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	pids=()
	if [ -n "$rpid" ]; then
		kill "$rpid" 2>/dev/null || true
		wait "$rpid" 2>/dev/null || true
		rpid=
	fi
}
cleanup() {
	stop_all
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

redis_up() {
	local port

	port=$(free_port)
	rm -rf "$tmp/redis"
	mkdir "$tmp/redis"
	redis-server --bind 127.0.0.1 --port "$port" --dir "$tmp/redis" --save '' \
		--appendonly no --protected-mode no >"$tmp/redis/log" 2>&1 &
	rpid=$!
	for _ in $(seq 100); do
		redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && { seeds="redis://127.0.0.1:$port"; return 0; }
		kill -0 "$rpid" 2>/dev/null || break
		sleep 0.1
	done
	echo "redis-server did not start: $(cat "$tmp/redis/log")" >&2
	exit 1
}

# node_up NAME CAPACITY [remote]: a daemon in $tmp/NAME, its pool "main" on the remote tier
# when asked.
node_up() {
	local dir=$tmp/$1

	rm -rf "$dir"
	mkdir "$dir"
	cat >"$dir/kvpaged.conf" <<EOF
[daemon]
socket = $dir/kvpaged.sock
admin_socket = $dir/admin.sock
ring_poll_us = 0
[pool main]
layers = 1
kv_heads = 1
head_dim = 8
element_bytes = 2
block_tokens = 512
capacity_blocks = $2
namespace = shared
EOF
	if [ "${3:-}" = remote ]; then
		cat >>"$dir/kvpaged.conf" <<EOF
remote_tier = $seeds
remote_tier_key_file = $tmp/remote.key
remote_tier_timeout_ms = 1000
remote_tier_max_inflight = 4096
EOF
	fi
	"$build/kvpaged" --config "$dir/kvpaged.conf" 2>"$dir/kvpaged.log" &
	pids+=($!)
	for _ in $(seq 100); do
		[ -S "$dir/admin.sock" ] && return 0
		kill -0 "${pids[-1]}" 2>/dev/null || break
		sleep 0.1
	done
	echo "kvpaged did not start: $(cat "$dir/kvpaged.log")" >&2
	exit 1
}

# replay CLIENTS_PER_NODE NODE...: the JSON line of one replay across the nodes.
replay() {
	local clients=$1 n args=()

	shift
	for n in "$@"; do
		args+=(--daemon "$tmp/$n/kvpaged.sock")
	done
	"$build/kvpaged-bench" replay --trace "$trace" --block-tokens 512 --prompt-only \
		--ordered --clients "$clients" "${args[@]}" --json
}

(umask 077 && head -c 32 /dev/urandom >"$tmp/remote.key")

echo "two nodes of $blocks blocks sharing the remote tier ($trace)" >&2
redis_up
node_up a "$blocks" remote
node_up b "$blocks" remote
shared=$(replay 1 a b)
echo "redis held $(redis-cli -p "${seeds##*:}" dbsize) values" >&2
stop_all

echo "two nodes of $blocks blocks, no remote tier" >&2
node_up a "$blocks"
node_up b "$blocks"
apart=$(replay 1 a b)
stop_all

echo "one node of $((2 * blocks)) blocks, two clients" >&2
node_up one "$((2 * blocks))"
single=$(replay 2 one)
stop_all

python3 - "$shared" "$apart" "$single" <<'EOF'
import json, sys
shared, apart, single = (json.loads(a) for a in sys.argv[1:])
def nodes(o):
    return " ".join("%.4f" % n["hit_fraction"] for n in o.get("nodes", []))
rows = [("2 nodes, shared remote tier", shared), ("2 nodes, no remote tier", apart),
        ("1 node, both capacities", single)]
print("%-28s %9s %9s %8s %8s  %s" % ("setup", "capacity", "requests", "blocks", "hit_frac",
                                    "per node"))
for name, o in rows:
    print("%-28s %9d %9d %8d %8.4f  %s" % (name, o["capacity_blocks"], o["requests"],
                                          o["blocks"], o["hit_fraction"], nodes(o)))
print("in-process replay at %d blocks: %.4f" % (single["capacity_blocks"],
                                               single["inprocess_hit_fraction"]))
s, a, one = (o["hit_fraction"] for o in (shared, apart, single))
print("shared - apart: %+.4f; shared - one node: %+.4f; apart - one node: %+.4f" %
      (s - a, s - one, a - one))
EOF
