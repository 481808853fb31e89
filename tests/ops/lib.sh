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

# dist_tree: the release tree, as make dist would pack it, in $dist ($tmp/dist/kvpaged-VERSION);
# sets version.  Skips when the packages' build dependencies are missing.
dist_tree() {
	version=$("$KVPAGED" --version | awk '{ print $2 }')
	dist=$tmp/dist/kvpaged-$version
	mkdir -p "$tmp/dist"
	sub_make distdir distdir="$dist" >"$tmp/dist.log" 2>&1 ||
		fail "make distdir: $(tail -20 "$tmp/dist.log")"
	cp -a "$dist/packaging/debian" "$dist/debian"
	(cd "$dist" && dpkg-checkbuilddeps) >"$tmp/deps.log" 2>&1 ||
		skip "build dependencies missing: $(cat "$tmp/deps.log")"
	rm -rf "$dist/debian"
}

# build_debs: the Debian packages from $dist (packaging/build-deb.sh, without their test suite)
# in $tmp/out; sets debs to kvpaged's, libkvpaged1's and libkvpaged-dev's .deb files.
build_debs() {
	local p deb

	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL DEB_BUILD_OPTIONS=nocheck \
		"$top_srcdir/packaging/build-deb.sh" "$dist" "$tmp/out" >"$tmp/build.log" 2>&1 || {
		tail -60 "$tmp/build.log" >&2
		fail "dpkg-buildpackage"
	}
	debs=()
	for p in kvpaged libkvpaged1 libkvpaged-dev python3-kvpaged; do
		deb=$(ls "$tmp/out/${p}_${version}-"*.deb 2>/dev/null) || fail "no $p package was built"
		debs+=("$deb")
	done
}
