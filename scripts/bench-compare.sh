#!/usr/bin/env bash
# Compares two build directories' daemons in one run, alternating, a fresh daemon for each
# measurement: `kvpaged-bench throughput` and `latency`, then the medians and their ratio.
# On a shared machine only such same-run comparisons mean anything (docs/bench.md).
#
#   scripts/bench-compare.sh BASE_BUILD NEW_BUILD [ROUNDS]
#
# Each build directory must hold kvpaged and kvpaged-bench (scripts/build.sh DIR).  The pool
# is 512-token blocks with ring_poll_us = 0 (the sleeping rings), as docs/bench.md quotes.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 BASE_BUILD NEW_BUILD [ROUNDS]" >&2; exit 2; }
base=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
rounds=${3:-5}
tmp=$(mktemp -d)
dpid=
cleanup() {
	[ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

cat >"$tmp/kvpaged.conf" <<EOF
[daemon]
socket = $tmp/kvpaged.sock
admin_socket = $tmp/admin.sock
ring_poll_us = 0
[pool main]
layers = 1
kv_heads = 1
head_dim = 8
element_bytes = 2
block_tokens = 512
capacity_blocks = 4096
EOF

start() {
	rm -f "$tmp/kvpaged.sock" "$tmp/admin.sock"
	"$1/kvpaged" --config "$tmp/kvpaged.conf" 2>"$tmp/kvpaged.log" &
	dpid=$!
	for _ in $(seq 100); do
		[ -S "$tmp/admin.sock" ] && return 0
		kill -0 "$dpid" 2>/dev/null || break
		sleep 0.1
	done
	echo "kvpaged from $1 did not start: $(cat "$tmp/kvpaged.log")" >&2
	exit 1
}

stop() {
	kill "$dpid"
	wait "$dpid" || true
	dpid=
}

field() {
	/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"
}

declare -A tput lat
for r in $(seq "$rounds"); do
	for which in base new; do
		dir=$base
		[ "$which" = new ] && dir=$new
		start "$dir"
		out=$("$dir/kvpaged-bench" throughput --daemon "$tmp/kvpaged.sock" --clients 4 \
			--batch 64 --json)
		ops=$(field "$out" ops_per_s)
		tput[$which]+="$ops "
		out=$("$dir/kvpaged-bench" latency --daemon "$tmp/kvpaged.sock" --iterations 20000 \
			--json)
		lat[$which]+="$(field "$out" ring_sleep_p50_us):$(field "$out" socket_p50_us) "
		stop
		echo "round $r $which: $ops ops/s" >&2
	done
done

/usr/bin/python3 - "${tput[base]}" "${tput[new]}" "${lat[base]}" "${lat[new]}" <<'EOF'
import statistics as st, sys
tb, tn = ([float(x) for x in a.split()] for a in sys.argv[1:3])
lb, ln = ([[float(y) for y in x.split(':')] for x in a.split()] for a in sys.argv[3:5])
def med(v): return st.median(v)
print(f"throughput ops/s  base median {med(tb)/1e6:.2f} M (range {min(tb)/1e6:.2f}-{max(tb)/1e6:.2f}),"
      f" new median {med(tn)/1e6:.2f} M (range {min(tn)/1e6:.2f}-{max(tn)/1e6:.2f}): new/base {med(tn)/med(tb):.3f}")
for i, name in enumerate(["ring sleep p50 us", "socket p50 us"]):
    b = [x[i] for x in lb]; n = [x[i] for x in ln]
    print(f"{name:18s} base median {med(b):.2f} ({', '.join(f'{x:.2f}' for x in b)}),"
          f" new median {med(n):.2f} ({', '.join(f'{x:.2f}' for x in n)}): new/base {med(n)/med(b):.3f}")
EOF
