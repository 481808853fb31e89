#!/usr/bin/env bash
# Builds kvpaged and shows what it does.  Starts the daemon in the foreground on a host-memory
# pool, from a generated configuration in a temporary runtime directory (no root needed for
# the daemon itself).  Replays a real serving trace from 4 client processes through it.
# Prints the hit table and `kvpagedctl status`, then stops the daemon cleanly.  The trace is
# Mooncake's synthetic one (../shared/traces beside the checkout), or a generated shared-prefix
# workload when that is absent.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
scripts/deps.sh
scripts/build.sh build
bin=$top/build
trace=${KVPAGED_TRACE:-$top/../shared/traces/mooncake/synthetic_trace.jsonl}

run=$(mktemp -d /tmp/kvpaged-quickstart-XXXXXX)
daemon_pid=
cleanup() {
	if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
		kill -TERM "$daemon_pid"
		wait "$daemon_pid" || true
	fi
	rm -rf "$run"
}
trap cleanup EXIT

# One pool of 10,000 blocks of 512 tokens for a small model geometry (the trace has no model:
# the KV bytes per token only size the memfd, allocated on first touch).
cat >"$run/kvpaged.conf" <<CONF
[daemon]
socket = $run/kvpaged.sock
admin_socket = $run/admin.sock

[limits]
max_sequences = 4096

[pool main]
layers = 2
kv_heads = 2
head_dim = 16
element_bytes = 2
block_tokens = 512
capacity_blocks = 10000
max_sequences = 65536

# The pool the stories260K engines use: its geometry is the model's (5 layers, 4 kv heads of
# 8 dims, float32), 16-token blocks.
[pool stories]
layers = 5
kv_heads = 4
head_dim = 8
element_bytes = 4
block_tokens = 16
capacity_blocks = 4096
CONF

echo "== kvpaged --check-config"
"$bin/kvpaged" --check-config --config "$run/kvpaged.conf" | sed -n '/^\[pool main/,/^$/p'
echo
echo "== starting kvpaged (log: $run/kvpaged.log)"
"$bin/kvpaged" --config "$run/kvpaged.conf" --foreground 2>"$run/kvpaged.log" &
daemon_pid=$!
for _ in $(seq 100); do
	[ -S "$run/kvpaged.sock" ] && break
	sleep 0.05
done
[ -S "$run/kvpaged.sock" ] || { cat "$run/kvpaged.log"; exit 1; }

if [ -f "$trace" ]; then
	echo "== replaying $(basename "$trace") from 4 client processes (prompts only, 512-token blocks)"
	echo "   Leading blocks committed by earlier requests, from any process, are reused instead"
	echo "   of recomputed.  Requests open in trace order (--ordered); their commits and closes"
	echo "   overlap across the 4 processes.  The in-process replay is the reference."
	"$bin/kvpaged-bench" replay --daemon "$run/kvpaged.sock" --admin "$run/admin.sock" \
		--clients 4 --ordered --trace "$trace" --block-tokens 512 --prompt-only
else
	echo "(no trace at $trace: in-process generated shared-prefix workload instead)"
	"$bin/kvpaged-bench" gsp --block-tokens 512 --system-tokens 4096 --question-tokens 512
fi
echo
opening="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she went to the park with her mom and her dog Max. The sun was shining and the birds were singing."
endings=(" Lily saw a big red ball" " Max found a stick" " Her mom gave her a kite" " They met a little boy")
echo
echo "== a real model on the pool: stories260K, 4 engine processes sharing one opening"
echo "   The first run computes the opening and commits its blocks; the 4 engines then start"
echo "   at once and skip the cached part of their prompts."
"$bin/kvpaged-llama" --socket "$run/kvpaged.sock" --pool stories --prompt "$opening" --steps 40 |
	tail -1 | sed 's/^/   cold: /'
engines=()
for i in 0 1 2 3; do
	"$bin/kvpaged-llama" --socket "$run/kvpaged.sock" --pool stories \
		--prompt "$opening${endings[$i]}" --steps 60 >"$run/story$i.txt" 2>&1 &
	engines+=($!)
done
for i in 0 1 2 3; do
	status=0
	wait "${engines[$i]}" || status=$?
	echo "-- engine $i"
	cat "$run/story$i.txt"
	[ "$status" -eq 0 ] || { echo "engine $i failed ($status)"; exit 1; }
done
echo

echo "== kvpagedctl status"
"$bin/kvpagedctl" --socket "$run/admin.sock" status
echo
echo "== kvpagedctl stats"
"$bin/kvpagedctl" --socket "$run/admin.sock" stats
"$bin/kvpagedctl" --socket "$run/admin.sock" verify
echo
echo "== stopping kvpaged"
kill -TERM "$daemon_pid"
wait "$daemon_pid"
daemon_pid=
echo "kvpaged exited cleanly"
