#!/usr/bin/env bash
# The Python binding beside the C library, and the Python engine's paged decode beside its
# --contiguous mode: tools/bench/python.py against one daemon with the engine's pool shape
# (stories260K: 5 layers, 4 kv heads, head_dim 8, float32, 16-token blocks) and
# ring_poll_us = 0, ROUNDS rounds (default 5); prints each round, then the medians and ratios.
#
#   scripts/bench-python.sh BUILD [ROUNDS] [--json]
#
# BUILD holds kvpaged, kvpaged-bench and .libs/libkvpaged.so.1 (scripts/build.sh DIR).
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 BUILD [ROUNDS] [--json]" >&2; exit 2; }
build=$(cd "$1" && pwd)
top=$(cd "$(dirname "$0")/.." && pwd)
rounds=${2:-5}
json=${3:-}
/usr/bin/python3 -c 'import numpy' 2>/dev/null ||
	{ echo "$0: /usr/bin/python3 has no numpy (python3-numpy)" >&2; exit 77; }
tmp=$(mktemp -d)
pid=
cleanup() {
	[ -z "$pid" ] || { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
	rm -rf "$tmp"
}
trap cleanup EXIT

cat >"$tmp/kvpaged.conf" <<CONF
[daemon]
socket = $tmp/kvpaged.sock
admin_socket = $tmp/admin.sock
ring_poll_us = 0
[pool main]
layers = 5
kv_heads = 4
head_dim = 8
element_bytes = 4
block_tokens = 16
capacity_blocks = 8192
CONF
"$build/kvpaged" --config "$tmp/kvpaged.conf" 2>"$tmp/kvpaged.log" &
pid=$!
for _ in $(seq 500); do
	[ -S "$tmp/admin.sock" ] && break
	kill -0 "$pid" 2>/dev/null || { cat "$tmp/kvpaged.log" >&2; exit 1; }
	sleep 0.01
done
KVPAGED_LIBRARY=$build/.libs/libkvpaged.so.1 PYTHONPATH=$top/python PYTHONDONTWRITEBYTECODE=1 \
	/usr/bin/python3 "$top/tools/bench/python.py" --daemon "$tmp/kvpaged.sock" \
	--bench "$build/kvpaged-bench" --rounds "$rounds" --llama "$top/python/examples/llama.py" \
	${json:+--json}
