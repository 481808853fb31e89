#!/usr/bin/env bash
# The one command for a lent GPU machine (the device tool; docs/cuda.md): says what the machine
# is, runs tests/gpu/run.sh, and leaves the logs in $OUT/gpu-logs.tar.gz.
#   here:  tests/gpu/bundle.sh                 (builds .gpu/, which the call carries)
#   there: tests/gpu/device.sh                 (run with carry [".gpu"])
# With a bundle (.gpu/, or $KVPAGED_GPU_BUNDLE) nothing is built there: the build's absolute path
# here is linked to the bundle, and the bundle's libraries serve only the sonames the machine
# lacks ($KVPAGED_GPU_ALL_LIBS=1: all of them).  Without one, run.sh builds with nvcc there.
# Exit status: run.sh's (0 passed, 1 failed, 77 no GPU).
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
out=${OUT:-$top/gpu-out}
mkdir -p "$out"
bundle=${KVPAGED_GPU_BUNDLE:-$top/.gpu}
[ -d "$bundle" ] && bundle=$(cd "$bundle" && pwd)
start=$SECONDS
libs=
build=
rc=1

# Every log, for reading afterwards (a few MiB at most): the tests', their TAP files, and the
# logs of daemons the tests kept because a case failed.  Written at the end, and on SIGTERM.
save_logs() {
	[ -n "$build" ] && [ -d "$build" ] || return 0
	mkdir -p "$build/daemon-logs"
	for l in /tmp/kvpaged-test-*/kvpaged.log; do
		[ -f "$l" ] && cp "$l" "$build/daemon-logs/$(basename "$(dirname "$l")").log"
	done
	(cd "$build" && tar czf "$out/gpu-logs.tar.gz" --ignore-failed-read \
		$(ls -d gpu-*.log gpu-*.tap daemon-logs 2>/dev/null)) 2>/dev/null
}
trap 'save_logs; exit 143' TERM
trap '[ -n "$libs" ] && rm -rf "$libs"' EXIT

{
	echo "== machine"
	echo "kernel $(uname -r) $(uname -m); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
	echo "$(ldd --version 2>/dev/null | head -1); $(nproc) CPUs"
	timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
		--format=csv,noheader 2>&1 | head -4
	command -v nvcc >/dev/null && nvcc --version | tail -1
	for t in gcc autoreconf pkg-config readelf; do
		printf '%s: %s\n' "$t" "$(command -v $t || echo missing)"
	done
} 2>&1 | tee "$out/machine.txt"

if [ -f "$bundle/build-path" ]; then
	built=$(cat "$bundle/build-path")
	build=$bundle/build
	if [ "$(cd "$build" && pwd -P)" != "$(cd "$built" 2>/dev/null && pwd -P)" ]; then
		# libtool's wrappers and the tests' paths name where it was built: make that path lead here.
		if [ -e "$built" ] && [ ! -L "$built" ]; then
			echo "gpu: $built exists here and is not the bundle; build there instead"
			build=
		else
			mkdir -p "$(dirname "$built")" && ln -sfn "$build" "$built" || build=
		fi
	fi
	[ -n "$build" ] && build=$built
fi

if [ -n "$build" ]; then
	libs=$(mktemp -d /tmp/kvpaged-libs.XXXXXX)
	have=$(ldconfig -p 2>/dev/null)
	for l in "$bundle"/lib/*; do
		[ -e "$l" ] || continue
		so=$(basename "$l")
		if [ "${KVPAGED_GPU_ALL_LIBS:-0}" = 1 ] || ! grep -q "^[[:space:]]$so " <<<"$have"; then
			ln -s "$l" "$libs/$so"
		fi
	done
	echo "== bundle $(cat "$bundle/commit" 2>/dev/null), needs $(cat "$bundle/glibc" 2>/dev/null); libraries taken from it: $(ls "$libs" | tr '\n' ' ')"
	export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	# Everything must load here before anything runs: else build here.
	missing=$(cd "$build" && for f in kvpaged kvpagedctl .libs/kvpaged-cuda.so tests/gpu/test-gpu-backend \
		tests/gpu/kvpaged-gpu-bench tests/gpu/.libs/test-gpu-share tests/gpu/.libs/test-nodriver; do
		LD_LIBRARY_PATH=$build/.libs:$LD_LIBRARY_PATH ldd "$f" 2>&1 | grep -E 'not found|No such' | sed "s|^|$f: |"
	done)
	if [ -n "$missing" ] || ! "$build/kvpaged" --version >/dev/null 2>&1; then
		echo "gpu: the bundle does not load here; building here instead"
		echo "$missing" | head -20
		build=
	else
		KVPAGED_GPU_PREBUILT=1 KVPAGED_GPU_BUILD=$build tests/gpu/run.sh 2>&1 | tee "$out/run.txt"
		rc=${PIPESTATUS[0]}
	fi
fi
if [ -z "$build" ]; then
	build=$top/build-gpu
	KVPAGED_GPU_BUILD=$build tests/gpu/run.sh "$@" 2>&1 | tee "$out/run.txt"
	rc=${PIPESTATUS[0]}
fi

save_logs
echo "device: run.sh exited $rc after $((SECONDS - start)) s"
exit "$rc"
