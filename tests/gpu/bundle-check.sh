#!/usr/bin/env bash
# Checks the GPU bundle without a GPU: builds one (tests/gpu/bundle.sh), moves it elsewhere, as
# the device tool does, and runs tests/gpu/device.sh on it with every carried library in use.
# The tests that need no GPU must pass from the moved bundle, with nothing built, and the
# script must say there is no GPU (77).  Then once more on the driver emulation, where every
# GPU test must pass.  scripts/check.sh runs it after the CUDA build.
#   tests/gpu/bundle-check.sh [DIR]        (default: build-bundle/)
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$top/build-bundle}
fail() { echo "FAIL: bundle: $*"; exit 1; }
rm -rf "$dir/a" "$dir/b" "$dir/out"
mkdir -p "$dir"
"$top/tests/gpu/bundle.sh" "$dir/a/.gpu" >"$dir/bundle.log" 2>&1 || { tail -30 "$dir/bundle.log"; fail "bundle.sh"; }
mv "$dir/a" "$dir/b"
OUT=$dir/out KVPAGED_GPU_BUNDLE=$dir/b/.gpu KVPAGED_GPU_ALL_LIBS=1 "$top/tests/gpu/device.sh" >"$dir/device.log" 2>&1
rc=$?
log=$dir/device.log
grep -q 'building here instead\|== build' "$log" && { cat "$log"; fail "the moved bundle was not used"; }
grep -q 'libraries taken from it: .*liburing.so' "$log" || { cat "$log"; fail "the carried libraries were not used"; }
if [ $rc -eq 0 ] && grep -q '^gpu: [0-9]* passed (nodriver nolink gpu-backend' "$log"; then
	echo "PASS: bundle (a GPU is here: it ran everything)"
	exit 0
fi
[ $rc -eq 77 ] || { cat "$log"; fail "device.sh exited $rc, not 77 (no GPU)"; }
grep -q '^gpu: no GPU here: 2 passed (nodriver nolink), 0 failed' "$log" || { cat "$log"; fail "the no-GPU tests did not both pass"; }
[ -L "$dir/a/.gpu/build" ] || fail "the build path was not linked to the moved bundle"
# Listed first: grep -q stopping early would kill tar with SIGPIPE, and pipefail would fail.
logs=$(tar tzf "$dir/out/gpu-logs.tar.gz") || fail "gpu-logs.tar.gz does not list"
grep -q gpu-nodriver.log <<<"$logs" || fail "no logs in gpu-logs.tar.gz: $logs"
what="moved, no driver"

# Then as on a GPU: the driver emulation (tests/fakecuda, built by the CUDA build's make check)
# stands in for the driver, and every GPU test must pass from the moved bundle (the benchmark,
# meaningless there, is left out), with the machine's own libraries taken where it has them.
fake=${FAKECUDA_LIBDIR:-$top/build-cuda/tests/fakecuda/.libs}
if [ -f "$fake/libcuda.so.1" ]; then
	rm -rf "$dir/out"
	OUT=$dir/out KVPAGED_GPU_BUNDLE=$dir/b/.gpu KVPAGED_GPU_SKIP_BENCH=1 \
		LD_LIBRARY_PATH=$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
		"$top/tests/gpu/device.sh" >"$dir/device-fake.log" 2>&1
	rc=$?
	log=$dir/device-fake.log
	grep -q 'building here instead\|== build' "$log" && { cat "$log"; fail "emulated: the moved bundle was not used"; }
	[ $rc -eq 0 ] || { cat "$log"; fail "emulated: device.sh exited $rc"; }
	grep -q '^gpu: 4 passed (nodriver nolink gpu-backend gpu-share), 0 failed' "$log" ||
		{ cat "$log"; fail "emulated: not every GPU test passed"; }
	logs=$(tar tzf "$dir/out/gpu-logs.tar.gz") || fail "emulated: gpu-logs.tar.gz does not list"
	grep -q gpu-gpu-share.tap <<<"$logs" || fail "emulated: no TAP files in gpu-logs.tar.gz: $logs"
	what="$what, and on the driver emulation"
else
	echo "bundle: no driver emulation at $fake (build-cuda's make check builds it): not run on it"
fi
echo "PASS: bundle ($what; $(sed -n 's/^bundle: .*(\(.*\)).*/\1/p' "$dir/bundle.log" | head -1 | cut -c1-40))"
