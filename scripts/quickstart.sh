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
CONF

echo "== kvpaged --check-config"
"$bin/kvpaged" --check-config --config "$run/kvpaged.conf" | sed -n '/^\[pool/,$p'
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
