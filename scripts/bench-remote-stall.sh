#!/usr/bin/env bash
# What another client's remote-tier fetches cost a local client's LOOKUPs: one kvpaged with a
# pool on a standalone redis-server (a cluster of one) and no tier between, so that what the
# pool evicts is only in Redis and every open of the loader fetches its 32 blocks (64 MiB)
# back, on the tier's thread, while the prober's LOOKUPs go on.  `kvpaged-bench stall` with
# --admin: the prober alone first (the baseline), then beside the loader, in one run; then the
# pool's remote counters from `kvpagedctl --json stats`, so the fetches are visible.
#
#   scripts/bench-remote-stall.sh BUILD [SECONDS]
#
# BUILD holds kvpaged, kvpaged-bench and kvpagedctl (scripts/build.sh DIR); SECONDS per phase
# defaults to 3.  The pool is docs/bench.md's 7B geometry (2 MiB blocks), 72 blocks; 4 prompts
# of 32 blocks, so each open evicts the prompt the next but one needs.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 BUILD [SECONDS]" >&2; exit 2; }
build=$(cd "$1" && pwd)
seconds=${2:-3}
command -v redis-server >/dev/null || { echo "$0: redis-server not installed" >&2; exit 77; }
command -v redis-cli >/dev/null || { echo "$0: redis-cli not installed" >&2; exit 77; }
tmp=$(mktemp -d)
dpid=
rpid=

cleanup() {
	local p

	for p in "$dpid" "$rpid"; do
		[ -n "$p" ] || continue
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir "$tmp/redis"
redis-server --bind 127.0.0.1 --port "$port" --dir "$tmp/redis" --save '' --appendonly no \
	--protected-mode no >"$tmp/redis/log" 2>&1 &
rpid=$!
for _ in $(seq 100); do
	redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break
	kill -0 "$rpid" 2>/dev/null || { echo "redis-server died: $(cat "$tmp/redis/log")" >&2; exit 1; }
	sleep 0.1
done

(umask 077 && head -c 32 /dev/urandom >"$tmp/remote.key")
# max_inflight 64: a 32-block fetch fits in half of it (the level's slots); a 2 s deadline,
# since sealing and opening 64 MiB takes tens of ms of one core on a busy 2-vCPU machine.
cat >"$tmp/kvpaged.conf" <<EOF
[daemon]
socket = $tmp/kvpaged.sock
admin_socket = $tmp/admin.sock
[pool remote]
layers = 32
kv_heads = 8
head_dim = 128
element_bytes = 2
block_tokens = 16
capacity_blocks = 72
namespace = shared
remote_tier = redis://127.0.0.1:$port
remote_tier_key_file = $tmp/remote.key
remote_tier_max_inflight = 64
remote_tier_timeout_ms = 2000
EOF
"$build/kvpaged" --config "$tmp/kvpaged.conf" 2>"$tmp/kvpaged.log" &
dpid=$!
for _ in $(seq 100); do
	[ -S "$tmp/admin.sock" ] && [ -S "$tmp/kvpaged.sock" ] && break
	kill -0 "$dpid" 2>/dev/null || { echo "kvpaged died: $(cat "$tmp/kvpaged.log")" >&2; exit 1; }
	sleep 0.1
done

out=$("$build/kvpaged-bench" stall --daemon "$tmp/kvpaged.sock" --admin "$tmp/admin.sock" \
	--pool remote --blocks 32 --prompts 4 --seconds "$seconds" --json)
stats=$("$build/kvpagedctl" --socket "$tmp/admin.sock" --json stats)
values=$(redis-cli -p "$port" dbsize)

python3 - "$out" "$stats" "$values" <<'EOF'
import json, sys
out, stats, values = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
p = out["pools"][0]
r = next(x for x in stats["pools"] if x["pool"] == "remote")["remote"]
misses = ", ".join("%s %d" % (k, v) for k, v in r["misses"].items() if v) or "none"
print("LOOKUP round trip of a local client, %d s per phase (one run):" % out["seconds"])
print("%-34s %10s %10s %10s %8s" % ("", "p50 us", "p99 us", "max us", "probes"))
print("%-34s %10.1f %10.1f %10.1f %8s" % ("alone (baseline)", p["idle_p50_us"],
                                          p["idle_p99_us"], p["idle_max_us"], "-"))
print("%-34s %10.1f %10.1f %10.1f %8d" % ("beside 32-block remote fetches", p["busy_p50_us"],
                                          p["busy_p99_us"], p["busy_max_us"], p["probes"]))
print("loader: %.1f opens/s, %.1f blocks reused per open" % (p["loader_opens_per_s"],
                                                         p["loader_blocks_per_open"]))
print("remote tier over the busy phase: %d fetches (%d refused busy), %d blocks fetched, %d missed"
      % (p["remote_fetches"], p["remote_fetches_busy"], p["remote_hits"], p["remote_misses"]))
print("whole run (kvpagedctl --json stats, pools[].remote): fetches %d, hits %d, misses %s "
      "(the caching opens' misses included); stores_ok %d, stores_dropped %d; fetch latency "
      "p50 %.1f ms, p99 %.1f ms; redis holds %d values"
      % (r["fetches"], r["hits"], misses, r["stores_ok"], r["stores_dropped"],
         r["latency_p50_ns"] / 1e6, r["latency_p99_ns"] / 1e6, values))
EOF
