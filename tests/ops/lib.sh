# Sourced by the shell tests in tests/ops/ (bash).  A temporary directory, a small
# configuration, the daemon and its clients with timeouts; on exit everything started is
# stopped and removed, and a failing test shows the daemon's log.
set -euo pipefail

KVPAGED=${KVPAGED_BIN:-./kvpaged}
KVPAGEDCTL=${KVPAGEDCTL_BIN:-./kvpagedctl}
OPS_CLIENT=${OPS_CLIENT:-./tests/ops/ops-client}
top_builddir=${abs_top_builddir:-$(cd "$(dirname "$KVPAGED")" && pwd)}
top_srcdir=${srcdir:-.}

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

skip() {
	echo "SKIP: $*"
	exit 77
}

tmp=$(mktemp -d /tmp/kvpaged-ops-XXXXXX)
daemon_pid=
bg_pids=()

cleanup() {
	local rc=$? pid

	for pid in ${bg_pids[@]+"${bg_pids[@]}"} $daemon_pid; do
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [ $rc -ne 0 ] && [ -s "$tmp/kvpaged.log" ]; then
		echo "--- kvpaged log ---" >&2
		tail -n 40 "$tmp/kvpaged.log" >&2
	fi
	rm -rf "$tmp"
	exit $rc
}
trap cleanup EXIT

# write_config SOCKET ADMIN_SOCKET: a small pool "main" in $tmp/kvpaged.conf.
write_config() {
	cat >"$tmp/kvpaged.conf" <<-EOF
	[daemon]
	socket = $1
	admin_socket = $2
	[pool main]
	layers = 2
	kv_heads = 2
	head_dim = 8
	element_bytes = 2
	block_tokens = 16
	capacity_blocks = 256
	EOF
}

ctl() {
	timeout 10 "$KVPAGEDCTL" "$@"
}

client() {
	timeout 20 "$OPS_CLIENT" "$@"
}

# wait_exit PID SECONDS: waits for a background process to end; returns its status.
wait_exit() {
	local pid=$1 i

	for ((i = 0; i < $2 * 100; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.01
	done
	kill -0 "$pid" 2>/dev/null && fail "pid $pid still runs after $2 s"
	local status=0
	wait "$pid" || status=$?
	return $status
}

# A make that runs on its own, not as part of the make running the tests.
sub_make() {
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL ${MAKE:-make} -s -C "$top_builddir" "$@"
}
