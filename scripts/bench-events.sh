#!/usr/bin/env bash
# What the KV event stream costs a replay: `kvpaged-bench replay --daemon` through one node with
# events off and on, alternating, a fresh daemon each run, ROUNDS rounds (default 3).  With
# events on, a subscriber (tests/integration/events-sub.py, which decodes every batch by vLLM's
# schema) reads the stream the whole time, or, with SUBSCRIBER=lazy, one that never reads (ZMQ
# drops its copies at the high-water mark), or with SUBSCRIBER=none no subscriber; the
# publisher's events_sched is EVENTS_SCHED (default idle).  Prints each run's wall time and
# p50/p99, then the medians and their ratios, and the stream's counters of the last run.
#
#   scripts/bench-events.sh BUILD [TRACE] [ROUNDS]
#
# BUILD holds kvpaged, kvpaged-bench and kvpagedctl (scripts/build.sh DIR); TRACE defaults to
# the Mooncake synthetic trace.  The pool is docs/bench.md's (512-token blocks, prompts only,
# ring_poll_us = 0), 5000 blocks, so blocks are evicted (removed events) as well as stored.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 BUILD [TRACE] [ROUNDS]" >&2; exit 2; }
build=$(cd "$1" && pwd)
top=$(cd "$(dirname "$0")/.." && pwd)
trace=${2:-$top/../shared/traces/mooncake/synthetic_trace.jsonl}
rounds=${3:-3}
lazy=${SUBSCRIBER:-reader}
[ -r "$trace" ] || { echo "$0: no trace $trace" >&2; exit 2; }
/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null ||
	{ echo "$0: /usr/bin/python3 has no zmq or msgpack" >&2; exit 77; }
tmp=$(mktemp -d)
pids=()

stop_all() {
	local p

	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	pids=()
}
cleanup() {
	stop_all
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# node_up on|off: a daemon in $tmp/node, its pool's stream on or off.
node_up() {
	local dir=$tmp/node

	rm -rf "$dir"
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
capacity_blocks = 5000
namespace = shared
CONF
	if [ "$1" = on ]; then
		cat >>"$dir/kvpaged.conf" <<CONF
events_endpoint = ipc://$dir/events
events_namespaces = ${EVENTS_NS:-shared/*}
events_topic = kv@bench@trace
events_batch_ms = ${BATCH_MS:-10}
events_sched = ${EVENTS_SCHED:-idle}
CONF
	fi
	"$build/kvpaged" --config "$dir/kvpaged.conf" 2>"$dir/kvpaged.log" &
	pids+=($!)
	for _ in $(seq 100); do
		[ -S "$dir/admin.sock" ] && break
		kill -0 "${pids[-1]}" 2>/dev/null || { echo "kvpaged: $(cat "$dir/kvpaged.log")" >&2; exit 1; }
		sleep 0.1
	done
	if [ "$1" = on ] && [ "$lazy" != none ]; then
		if [ "$lazy" = lazy ]; then
			/usr/bin/python3 -c 'import sys, time, zmq
s = zmq.Context().socket(zmq.SUB); s.setsockopt(zmq.SUBSCRIBE, b""); s.setsockopt(zmq.RCVHWM, 16)
s.connect(sys.argv[1]); time.sleep(3600)' "ipc://$dir/events" &
		else
			/usr/bin/python3 "$top/tests/integration/events-sub.py" listen "ipc://$dir/events" \
				>/dev/null &
		fi
		pids+=($!)
		sleep 0.5
	fi
}

replay() {
	"$build/kvpaged-bench" replay --trace "$trace" --block-tokens 512 --prompt-only --ordered \
		--daemon "$tmp/node/kvpaged.sock" --admin "$tmp/node/admin.sock" --json |
		tr -d '\n'
}

results=()
for r in $(seq "$rounds"); do
	for mode in off on; do
		node_up "$mode"
		results+=("$mode $(replay)")
		if [ "$mode" = on ]; then
			"$build/kvpagedctl" --socket "$tmp/node/admin.sock" --json stats >"$tmp/stats.json"
		fi
		stop_all
		echo "round $r: events $mode done" >&2
	done
done

printf '%s\n' "${results[@]}" >"$tmp/results"
python3 - "$tmp/results" "$tmp/stats.json" "$lazy" <<'PY'
import json, statistics, sys
runs = {"off": [], "on": []}
for line in open(sys.argv[1]):
    mode, js = line.split(" ", 1)
    runs[mode].append(json.loads(js))
print("%-4s %10s %8s %8s %9s" % ("run", "wall_ms", "p50_us", "p99_us", "hit_frac"))
for mode in ("off", "on"):
    for o in runs[mode]:
        print("%-4s %10.1f %8.1f %8.1f %9.4f" % (mode, o["wall_ms"], o["p50_us"], o["p99_us"],
                                                o["hit_fraction"]))
med = {m: {k: statistics.median(o[k] for o in runs[m]) for k in ("wall_ms", "p50_us", "p99_us")}
       for m in runs}
for k in ("wall_ms", "p50_us", "p99_us"):
    print("median %-7s off %9.1f  on %9.1f  on/off %.3f" % (k, med["off"][k], med["on"][k],
                                                         med["on"][k] / med["off"][k]))
st = json.load(open(sys.argv[2]))
for p in st.get("pools", []):
    e = p.get("events")
    if e:
        print("stream (last run, subscriber %s): %d batches, %d events, %d dropped, "
              "publisher raised %d times" % (sys.argv[3], e["batches"], e["events"],
                                             e["dropped"], e.get("raised", 0)))
PY
