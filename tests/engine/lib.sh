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

cleanup() {
	local rc=$?

	if [ -n "$daemon_pid" ]; then
		kill -KILL "$daemon_pid" 2>/dev/null || true
		wait "$daemon_pid" 2>/dev/null || true
	fi
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

# start_daemon [LAYERS]: one pool "main" of 16-token blocks (LAYERS overrides the model's 5).
start_daemon() {
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
	capacity_blocks = 4096
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

llama() {
	timeout 120 "$LLAMA" --model "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" "$@"
}

# field JSON-LINE KEY
field() {
	python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"
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
