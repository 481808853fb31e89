# Sourced by the engine tests (bash).  Starts the real kvpaged on a temporary directory with a
# pool that fits stories260K, runs kvpaged-llama and kvpagedctl with timeouts, and on exit
# stops the daemon and removes everything.
set -euo pipefail

KVPAGED=${KVPAGED_BIN:-./kvpaged}
KVPAGEDCTL=${KVPAGEDCTL_BIN:-./kvpagedctl}
# The engine is built beside the daemon.
LLAMA=${LLAMA_BIN:-$(dirname "$KVPAGED")/kvpaged-llama}
DATA=${srcdir:-.}/data/stories260K
SAMPLE=$DATA/tinystories_sample.txt
# llama2.c doc/stories260K.md: greedy decoding from BOS alone.
REFERENCE='Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.'

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

tmp=$(mktemp -d /tmp/kvpaged-engine-XXXXXX)
daemon_pid=
# Engines a test runs in the background (llama_bg): stopped on exit, so none outlives a
# failed test.
engine_pids=()
# More daemons (start_daemon_in), by directory, and other processes a test starts in the
# background (a redis-server, bg_pids): killed on exit.
declare -A daemon_in_pid=()
bg_pids=()

cleanup() {
	local rc=$? pid dir

	for pid in ${engine_pids[@]+"${engine_pids[@]}"}; do
		# TERM, which timeout(1) passes on to the engine; KILL would leave the engine behind.
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [ -n "$daemon_pid" ]; then
		kill -KILL "$daemon_pid" 2>/dev/null || true
		wait "$daemon_pid" 2>/dev/null || true
	fi
	# (bash >= 4.4: an empty array under set -u expands to nothing.)
	for dir in "${!daemon_in_pid[@]}"; do
		kill -KILL "${daemon_in_pid[$dir]}" 2>/dev/null || true
		wait "${daemon_in_pid[$dir]}" 2>/dev/null || true
		if [ $rc -ne 0 ] && [ -s "$dir/kvpaged.log" ]; then
			echo "--- kvpaged log ($dir) ---" >&2
			tail -n 30 "$dir/kvpaged.log" >&2
		fi
	done
	for pid in ${bg_pids[@]+"${bg_pids[@]}"}; do
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [ $rc -ne 0 ] && [ -s "$tmp/kvpaged.log" ]; then
		echo "--- kvpaged log ---" >&2
		tail -n 30 "$tmp/kvpaged.log" >&2
	fi
	rm -rf "$tmp"
	exit $rc
}
trap cleanup EXIT

ctl() {
	timeout 10 "$KVPAGEDCTL" --socket "$tmp/admin.sock" "$@"
}

# start_daemon [LAYERS [POOL-LINES]]: one pool "main" of 16-token blocks (LAYERS, if not empty,
# overrides the model's 5).  POOL-LINES are more keys of the pool, one a line; one that sets
# capacity_blocks replaces the default 4096.
start_daemon() {
	local capacity='capacity_blocks = 4096'

	case "${2:-}" in *capacity_blocks*) capacity= ;; esac
	cat >"$tmp/kvpaged.conf" <<-EOF
	[daemon]
	socket = $tmp/kvpaged.sock
	admin_socket = $tmp/admin.sock
	[pool main]
	layers = ${1:-5}
	kv_heads = 4
	head_dim = 8
	element_bytes = 4
	block_tokens = 16
	$capacity
	${2:-}
	EOF
	"$KVPAGED" --config "$tmp/kvpaged.conf" --verbose 2>"$tmp/kvpaged.log" &
	daemon_pid=$!
	export KVPAGED_SOCKET=$tmp/kvpaged.sock
	# The admin socket listens after the client one: once it answers, both do.
	for _ in $(seq 500); do
		ctl status >/dev/null 2>&1 && return 0
		kill -0 "$daemon_pid" 2>/dev/null || fail "kvpaged exited at start"
		sleep 0.01
	done
	fail "kvpaged did not answer within 5 s"
}

# stop_daemon: SIGTERM, and a clean exit within 5 s.
stop_daemon() {
	local status=0

	kill -TERM "$daemon_pid"
	for _ in $(seq 500); do
		kill -0 "$daemon_pid" 2>/dev/null || break
		sleep 0.01
	done
	kill -0 "$daemon_pid" 2>/dev/null && fail "kvpaged did not stop within 5 s of SIGTERM"
	wait "$daemon_pid" || status=$?
	daemon_pid=
	[ "$status" -eq 0 ] || fail "kvpaged exited with status $status"
}

# start_daemon_in DIR [LAYERS [POOL-LINES]]: another daemon, like start_daemon's, with its
# configuration, sockets (DIR/kvpaged.sock, DIR/admin.sock) and log in DIR (made if missing);
# stopped on exit.  It leaves KVPAGED_SOCKET alone: give it per command, or use ctl_in DIR.
start_daemon_in() {
	local dir=$1 capacity='capacity_blocks = 4096'

	shift
	case "${2:-}" in *capacity_blocks*) capacity= ;; esac
	mkdir -p "$dir"
	cat >"$dir/kvpaged.conf" <<-EOF
	[daemon]
	socket = $dir/kvpaged.sock
	admin_socket = $dir/admin.sock
	[pool main]
	layers = ${1:-5}
	kv_heads = 4
	head_dim = 8
	element_bytes = 4
	block_tokens = 16
	$capacity
	${2:-}
	EOF
	"$KVPAGED" --config "$dir/kvpaged.conf" --verbose 2>"$dir/kvpaged.log" &
	daemon_in_pid[$dir]=$!
	for _ in $(seq 500); do
		ctl_in "$dir" status >/dev/null 2>&1 && return 0
		kill -0 "${daemon_in_pid[$dir]}" 2>/dev/null || fail "kvpaged in $dir exited at start"
		sleep 0.01
	done
	fail "kvpaged in $dir did not answer within 5 s"
}

# ctl_in DIR ARGS: kvpagedctl on the daemon start_daemon_in started in DIR.
ctl_in() {
	local dir=$1

	shift
	timeout 10 "$KVPAGEDCTL" --socket "$dir/admin.sock" "$@"
}

# stop_daemon_in DIR: SIGTERM, and a clean exit within 5 s.
stop_daemon_in() {
	local dir=$1 pid=${daemon_in_pid[$1]} status=0

	kill -TERM "$pid"
	for _ in $(seq 500); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.01
	done
	kill -0 "$pid" 2>/dev/null && fail "kvpaged in $dir did not stop within 5 s of SIGTERM"
	wait "$pid" || status=$?
	unset "daemon_in_pid[$dir]"
	[ "$status" -eq 0 ] || fail "kvpaged in $dir exited with status $status"
}

llama() {
	timeout 120 "$LLAMA" --model "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" "$@"
}

# llama_bg OUT ERR [ARGS]: the same in the background, stdout to OUT and stderr to ERR.  Its
# pid (timeout's, in $!) goes to engine_pids, so that cleanup stops it.
llama_bg() {
	local out=$1 err=$2

	shift 2
	timeout 120 "$LLAMA" --model "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" "$@" \
		>"$out" 2>"$err" &
	engine_pids+=($!)
}

# llama_wait PID: waits for an engine llama_bg started, and returns its exit status.
llama_wait() {
	local pid=$1 status=0 p left=()

	wait "$pid" || status=$?
	# Reaped: its pid may be reused, and must not be signalled on exit.
	for p in ${engine_pids[@]+"${engine_pids[@]}"}; do
		[ "$p" = "$pid" ] || left+=("$p")
	done
	engine_pids=(${left[@]+"${left[@]}"})
	return $status
}

# field JSON-LINE KEY
field() {
	python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"
}

# pool_stat KEY: the first pool's KEY in kvpagedctl stats.
pool_stat() {
	ctl --json stats |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["pools"][0][sys.argv[1]])' "$1"
}

# text JSON-LINE [I]: continuation I's text (default 0).
text() {
	python3 -c 'import json,sys; print(json.loads(sys.argv[1])["texts"][int(sys.argv[2])])' \
		"$1" "${2:-0}"
}

# starts_with TEXT PREFIX
starts_with() {
	case "$1" in "$2"*) return 0 ;; *) return 1 ;; esac
}
