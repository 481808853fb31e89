#!/usr/bin/env bash
# The routing benchmark of docs/events.md: NODES daemons (default 4) of BLOCKS blocks each
# (default 2500), their KV event streams on, and `kvpaged-bench route` over them with every
# router, beside one node of all the capacity (in-process).
#
#   scripts/bench-route.sh BUILD [TRACE] [-- ROUTE OPTIONS...]
#
# BUILD holds kvpaged and kvpaged-bench (scripts/build.sh DIR); TRACE defaults to the Mooncake
# synthetic trace.  The pools are docs/bench.md's (512-token blocks, prompts only,
# ring_poll_us = 0).  NODES, BLOCKS and BATCH_MS (events_batch_ms, default 10) in the
# environment change the setup; options after -- go to kvpaged-bench route (--requests N,
# --json, --load-factor F, --router LIST).
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 BUILD [TRACE] [-- ROUTE OPTIONS...]" >&2; exit 2; }
build=$(cd "$1" && pwd)
shift
top=$(cd "$(dirname "$0")/.." && pwd)
trace=$top/../shared/traces/mooncake/synthetic_trace.jsonl
if [ $# -ge 1 ] && [ "$1" != -- ]; then
	trace=$1
	shift
fi
[ $# -ge 1 ] && [ "$1" = -- ] && shift
nodes=${NODES:-4}
blocks=${BLOCKS:-2500}
[ -r "$trace" ] || { echo "$0: no trace $trace" >&2; exit 2; }
tmp=$(mktemp -d)
pids=()

cleanup() {
	local p

	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

args=()
for n in $(seq "$nodes"); do
	dir=$tmp/node$n
	mkdir "$dir"
	cat >"$dir/kvpaged.conf" <<CONF
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
capacity_blocks = $blocks
namespace = shared
events_endpoint = ipc://$dir/events
events_namespaces = shared/*
events_topic = kv@node$n@trace
events_batch_ms = ${BATCH_MS:-10}
CONF
	"$build/kvpaged" --config "$dir/kvpaged.conf" 2>"$dir/kvpaged.log" &
	pids+=($!)
	args+=(--daemon "$dir/kvpaged.sock" --events "ipc://$dir/events")
done
for n in $(seq "$nodes"); do
	for _ in $(seq 100); do
		[ -S "$tmp/node$n/admin.sock" ] && break
		sleep 0.1
	done
	[ -S "$tmp/node$n/admin.sock" ] || { echo "kvpaged: $(cat "$tmp/node$n/kvpaged.log")" >&2; exit 1; }
done
"$build/kvpaged-bench" route --trace "$trace" --block-tokens 512 "${args[@]}" "$@"
