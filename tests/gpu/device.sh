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
start=$SECONDS

{
	echo "== machine"
	echo "kernel $(uname -r) $(uname -m); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
	echo "$(ldd --version 2>/dev/null | head -1); $(nproc) CPUs"
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -4
	command -v nvcc >/dev/null && nvcc --version | tail -1
	for t in gcc autoreconf pkg-config readelf; do
		printf '%s: %s\n' "$t" "$(command -v $t || echo missing)"
	done
} 2>&1 | tee "$out/machine.txt"

build=
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
	for l in "$bundle"/lib/*; do
		[ -e "$l" ] || continue
		so=$(basename "$l")
		if [ "${KVPAGED_GPU_ALL_LIBS:-0}" = 1 ] || ! ldconfig -p 2>/dev/null | grep -q "^[[:space:]]$so "; then
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

# A GPU test that failed runs again under compute-sanitizer (memcheck), while the time allows:
# one lent run must say as much as it can.
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
for t in gpu-backend gpu-share; do
	grep -q "^gpu: .*failed (.*\b$t\b" "$out/run.txt" 2>/dev/null || continue
	[ -n "$sanitizer" ] || { echo "device: no compute-sanitizer to rerun $t under"; break; }
	[ $((SECONDS - start)) -lt 300 ] || { echo "device: no time left to rerun $t under compute-sanitizer"; break; }
	echo "== $t under compute-sanitizer (memcheck)"
	prog=./tests/gpu/test-${t#gpu-}
	(cd "$build" && timeout 150 "$sanitizer" --tool memcheck --target-processes all \
		--print-limit 50 "$prog") >"$build/gpu-$t-memcheck.log" 2>&1
	echo "$t under memcheck exited $?"
	grep -E '^========= (ERROR SUMMARY|Invalid|Program hit)' "$build/gpu-$t-memcheck.log" | head -10
done

# Every log, for reading afterwards (at most a few MiB).
(cd "$build" 2>/dev/null && tar czf "$out/gpu-logs.tar.gz" --ignore-failed-read gpu-*.log gpu-*.tap tests/gpu/*.log \
	$(ls test-*.log 2>/dev/null) 2>/dev/null)
echo "device: run.sh exited $rc after $((SECONDS - start)) s"
exit "$rc"
