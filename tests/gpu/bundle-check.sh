#!/usr/bin/env bash
# Checks the GPU bundle without a GPU: builds one (tests/gpu/bundle.sh), moves it elsewhere, as
# the device tool does, and runs tests/gpu/device.sh on it with every carried library in use.
# The tests that need no GPU must pass from the moved bundle, with nothing built, and the
# script must say there is no GPU (77).  scripts/check.sh runs it after the CUDA build.
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
if [ $rc -eq 0 ] && grep -q '^gpu: [0-9]* passed (gpu-backend' "$log"; then
	echo "PASS: bundle (a GPU is here: it ran everything)"
	exit 0
fi
[ $rc -eq 77 ] || { cat "$log"; fail "device.sh exited $rc, not 77 (no GPU)"; }
grep -q '^gpu: no GPU here: 2 passed (nodriver nolink), 0 failed' "$log" || { cat "$log"; fail "the no-GPU tests did not both pass"; }
[ -L "$dir/a/.gpu/build" ] || fail "the build path was not linked to the moved bundle"
tar tzf "$dir/out/gpu-logs.tar.gz" | grep -q gpu-nodriver.log || fail "no logs in gpu-logs.tar.gz"
echo "PASS: bundle (moved, $(sed -n 's/^bundle: .*(\(.*\)).*/\1/p' "$dir/bundle.log" | head -1 | cut -c1-60))"
