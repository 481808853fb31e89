#!/usr/bin/env bash
# kvpaged under abuse, as one real daemon sees it: a storm of SIGKILLed clients under load,
# an idle-connection flood from another uid, file descriptors running out, and, by hand, a
# long soak.  Each phase prints its figures.  kvpagedctl status is asked every 200 ms the
# whole time (but while the daemon has no fd at all to accept with) and must always answer.
#
#   tests/stress/stress.sh --short [BUILD]      the CI mode (about a minute): asserts no leaked
#                                               block, kvpagedctl verify clean, the admin
#                                               socket always reachable, log lines bounded
#   tests/stress/stress.sh [--kills N] [BUILD]  the same with N kills (default 5000)
#   tests/stress/stress.sh --soak MIN [BUILD]   MIN minutes of load and kills, RSS sampled every
#                                               minute; asserts the same and a flat RSS
#
# BUILD is a build directory (default: build).  The other-uid flood needs root and a user
# nobody; without them it is skipped, and says so.
set -euo pipefail

mode=full
kills=5000
soak_min=0
while [ $# -gt 0 ]; do
	case $1 in
	--short) mode=short; kills=1000; shift ;;
	--kills) kills=$2; shift 2 ;;
	--soak) mode=soak; soak_min=$2; shift 2 ;;
	-h|--help) sed -n '2,14p' "$0"; exit 0 ;;
	*) break ;;
	esac
done
build=$(cd "${1:-build}" && pwd)
kvpaged=$build/kvpaged
ctl=$build/kvpagedctl
client=$build/tests/stress/stress-client
for f in "$kvpaged" "$ctl" "$client"; do
	[ -x "$f" ] || { echo "stress: $f is not built (make -C $build check builds it)" >&2; exit 2; }
done

fail() {
	echo "stress: FAIL: $*" >&2
	exit 1
}

tmp=$(mktemp -d /tmp/kvpaged-stress-XXXXXX)
chmod 0755 "$tmp" # the other uid's flood must reach the socket
sock=$tmp/kvpaged.sock
admin=$tmp/admin.sock
log=$tmp/kvpaged.log
daemon=
watcher=
workers=()

cleanup() {
	local rc=$? p
	[ -n "$watcher" ] && kill "$watcher" 2>/dev/null
	for p in ${workers[@]+"${workers[@]}"}; do kill -9 "$p" 2>/dev/null || true; done
	[ -n "$daemon" ] && kill -9 "$daemon" 2>/dev/null
	wait 2>/dev/null || true
	if [ $rc -ne 0 ] && [ -s "$log" ]; then
		echo "--- kvpaged log (last 30 lines) ---" >&2
		tail -n 30 "$log" >&2
	fi
	rm -rf "$tmp"
	exit $rc
}
trap cleanup EXIT

cat >"$tmp/kvpaged.conf" <<EOF
[daemon]
socket = $sock
admin_socket = $admin
[limits]
hello_timeout_ms = 1000
[pool main]
layers = 2
kv_heads = 2
head_dim = 8
element_bytes = 2
block_tokens = 16
capacity_blocks = 4096
host_tier_blocks = 2048
EOF

# The production log level (no --verbose): what an operator's journal would get.
"$kvpaged" --config "$tmp/kvpaged.conf" 2>"$log" &
daemon=$!
for _ in $(seq 100); do [ -S "$admin" ] && "$ctl" --socket "$admin" status >/dev/null 2>&1 && break; sleep 0.05; done
"$ctl" --socket "$admin" status >/dev/null || fail "kvpaged did not start"

json() { # FIELD: an integer of kvpagedctl --json status
	"$ctl" --socket "$admin" --json status | sed -n "s/^ *\"$1\": \([0-9]*\).*/\1/p" | head -1
}
rss_kib() { awk '$1 == "VmRSS:" { print $2 }' "/proc/$daemon/status"; }
cpu_s() { # the daemon's user + system time, in seconds
	awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$daemon/stat"
}
lines() { wc -l <"$log"; }

# kvpagedctl status every 200 ms; a file per outcome.  Paused while $tmp/nowatch exists.
watch_admin() {
	while :; do
		if [ ! -e "$tmp/nowatch" ]; then
			local t0 t1
			t0=$(date +%s%N)
			if "$ctl" --socket "$admin" status >/dev/null 2>>"$tmp/admin-errors"; then
				t1=$(date +%s%N)
				echo $(((t1 - t0) / 1000000)) >>"$tmp/admin-ms"
			else
				echo "$(date +%T.%N) status failed" >>"$tmp/admin-errors"
				echo x >>"$tmp/admin-failures"
			fi
		fi
		sleep 0.2
	done
}
watch_admin &
watcher=$!

start_worker() { # INDEX: a worker, with rings for odd ones
	local extra=
	[ $(($1 % 2)) -eq 1 ] && extra=--rings
	"$client" work "$sock" 600 $extra --seed "$RANDOM$1" 2>>"$tmp/worker-errors" &
	workers[$1]=$!
}

rss0=$(rss_kib)
lines0=$(lines)
echo "== kvpaged pid $daemon: RSS $rss0 KiB at start"

# ---- 1. a SIGKILL storm under load ----------------------------------------------------------
nworkers=8
for i in $(seq 0 $((nworkers - 1))); do start_worker "$i"; done
sleep 1
t0=$(date +%s%N)
cpu0=$(cpu_s)
# bash says "Killed" of every worker it reaps: the shell's own stderr is quiet meanwhile.
exec 3>&2 2>/dev/null
for k in $(seq 1 "$kills"); do
	i=$((RANDOM % nworkers))
	kill -9 "${workers[$i]}" 2>/dev/null || true
	{ wait "${workers[$i]}"; } 2>/dev/null || true
	start_worker "$i"
	[ $((k % 8)) -eq 0 ] && sleep 0.01
done
t1=$(date +%s%N)
for i in $(seq 0 $((nworkers - 1))); do kill -9 "${workers[$i]}" 2>/dev/null || true; done
{ wait "${workers[@]}"; } 2>/dev/null || true
exec 2>&3 3>&-
workers=()
storm_ms=$(((t1 - t0) / 1000000))
# The daemon sees every hang-up; then nothing may be left.
for _ in $(seq 100); do [ "$(json in_use)" = 0 ] && break; sleep 0.05; done
in_use=$(json in_use)
seqs=$(json sequences)
"$ctl" --socket "$admin" verify >/dev/null || fail "kvpagedctl verify after the storm: $("$ctl" --socket "$admin" verify)"
rss1=$(rss_kib)
echo "== storm: $kills clients SIGKILLed under load in $((storm_ms / 1000)).$((storm_ms % 1000 / 100)) s" \
	"($((kills * 1000 / (storm_ms + 1))) a second), daemon CPU $(echo "$(cpu_s) - $cpu0" | bc) s;" \
	"blocks in use after: $in_use, sequences: $seqs, verify clean; RSS $rss0 -> $rss1 KiB"
[ "$in_use" = 0 ] || fail "$in_use blocks still in use after the storm"
[ "$seqs" = 0 ] || fail "$seqs sequences still open after the storm"
if [ -s "$tmp/worker-errors" ] && grep -qv "^$" "$tmp/worker-errors"; then
	fail "a worker saw an unexpected error: $(head -3 "$tmp/worker-errors")"
fi

# ---- 2. an idle-connection flood from another uid -----------------------------------------
if [ "$(id -u)" = 0 ] && getent passwd nobody >/dev/null; then
	for i in 0 1 2 3; do start_worker "$i"; done
	made=$("$client" flood "$sock" 512 5 --as nobody)
	for i in 0 1 2 3; do kill "${workers[$i]}" 2>/dev/null || true; done
	{ wait "${workers[@]}"; } 2>/dev/null || true
	workers=()
	echo "== flood: user nobody made $made idle connections in 5 s (512 at a time);" \
		"refused by max_sessions_per_uid: $(json max_sessions_per_uid), closed by hello_timeout_ms: $(json hello_timeout_ms)"
	[ "$(json max_sessions_per_uid)" -gt 0 ] || fail "the flood was never refused"
else
	echo "== flood: SKIPPED (needs root and a user nobody)"
fi

# ---- 3. file descriptors running out -------------------------------------------------------
lowest_free() { # the daemon's lowest free fd number: with the limit there it can open nothing
	local n=0
	while [ -e "/proc/$daemon/fd/$n" ]; do n=$((n + 1)); done
	echo "$n"
}
hard=$(prlimit --pid "$daemon" --nofile --noheadings --output HARD | tr -d ' ')
soft=$(prlimit --pid "$daemon" --nofile --noheadings --output SOFT | tr -d ' ')
# a. Fewer left than a client session needs beside the admin slots' reserve: clients are
#    refused by name, the admin socket still answers (the watcher says so).
prlimit --pid "$daemon" --nofile="$(($(lowest_free) + 20)):$hard"
made=$("$client" flood "$sock" 64 3)
refused=$(json "out of file descriptors")
echo "== fds low: $made connections in 3 s, $refused refused for the fds left; the admin socket answered"
[ "$refused" -gt 0 ] || fail "no client was refused with the fds nearly gone"
# b. None left at all: accepting fails, and the daemon must wait, not spin.
touch "$tmp/nowatch"
sleep 0.3
prlimit --pid "$daemon" --nofile="$(lowest_free):$hard"
l0=$(lines)
c0=$(cpu_s)
made=$("$client" flood "$sock" 256 5)
emfile_lines=$(($(lines) - l0))
emfile_cpu=$(echo "$(cpu_s) - $c0" | bc)
prlimit --pid "$daemon" --nofile="$soft:$hard"
ok=
for _ in $(seq 60); do "$ctl" --socket "$admin" status >/dev/null 2>&1 && { ok=1; break; }; sleep 0.1; done
rm -f "$tmp/nowatch"
[ -n "$ok" ] || fail "kvpaged did not accept again within 6 s of the fds coming back"
echo "== fds out: $made connections in 5 s at the limit; $emfile_lines log lines, daemon CPU" \
	"$emfile_cpu s; $(json "accept errors") accepts failed; accepting again once fds came back"
[ "$emfile_lines" -lt 100 ] || fail "$emfile_lines log lines in 5 s at the fd limit"

# ---- 4. the soak ------------------------------------------------------------------------------
if [ "$soak_min" -gt 0 ]; then
	echo "== soak: $soak_min minutes of load, a client killed every 100 ms; RSS every minute"
	for i in $(seq 0 $((nworkers - 1))); do start_worker "$i"; done
	exec 3>&2 2>/dev/null
	samples=()
	end=$(($(date +%s) + soak_min * 60))
	next=$(($(date +%s) + 60))
	n=0
	while [ "$(date +%s)" -lt "$end" ]; do
		i=$((RANDOM % nworkers))
		kill -9 "${workers[$i]}" 2>/dev/null || true
		{ wait "${workers[$i]}"; } 2>/dev/null || true
		start_worker "$i"
		n=$((n + 1))
		sleep 0.1
		if [ "$(date +%s)" -ge "$next" ]; then
			samples+=("$(rss_kib)")
			echo "   minute ${#samples[@]}: RSS ${samples[-1]} KiB, $n kills"
			next=$((next + 60))
		fi
	done
	for i in $(seq 0 $((nworkers - 1))); do kill -9 "${workers[$i]}" 2>/dev/null || true; done
	{ wait "${workers[@]}"; } 2>/dev/null || true
	exec 2>&3 3>&-
	workers=()
	for _ in $(seq 100); do [ "$(json in_use)" = 0 ] && break; sleep 0.05; done
	[ "$(json in_use)" = 0 ] || fail "$(json in_use) blocks in use after the soak"
	"$ctl" --socket "$admin" verify >/dev/null || fail "kvpagedctl verify after the soak"
	if [ ${#samples[@]} -ge 2 ] && [ "${samples[-1]}" -gt $((samples[0] * 3 / 2 + 4096)) ]; then
		fail "RSS grew from ${samples[0]} to ${samples[-1]} KiB over the soak"
	fi
	echo "== soak: $n kills; RSS ${samples[*]:-} KiB; nothing in use after, verify clean"
fi

# ---- the end ----------------------------------------------------------------------------------
kill "$watcher" 2>/dev/null || true
wait "$watcher" 2>/dev/null || true
watcher=
count() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
failures=$(count "$tmp/admin-failures")
asked=$(count "$tmp/admin-ms")
worst=$(sort -n "$tmp/admin-ms" 2>/dev/null | tail -1)
p50=$(sort -n "$tmp/admin-ms" 2>/dev/null | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
total_lines=$(($(lines) - lines0))
kill -TERM "$daemon"
wait "$daemon" && status=0 || status=$?
daemon=
echo "== admin: kvpagedctl status answered $asked times (median ${p50:-?} ms, worst ${worst:-?} ms)," \
	"failed $failures times; the daemon logged $total_lines lines; it exited with status $status"
[ "$failures" -eq 0 ] || fail "kvpagedctl status failed $failures times: $(head -3 "$tmp/admin-errors")"
[ "$total_lines" -lt 300 ] || fail "the daemon logged $total_lines lines (the log is not bounded)"
[ "$status" -eq 0 ] || fail "kvpaged exited with status $status"
echo "stress: ok"
