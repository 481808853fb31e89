#!/usr/bin/env bash
# Every GPU test and the GPU benchmark, on a machine with an NVIDIA GPU and driver: builds
# kvpaged with the CUDA backend (in build-gpu/, or $KVPAGED_GPU_BUILD), runs the GPU tests and
# kvpaged-gpu-bench, and ends with a summary.  Meant to take well under 5 minutes.
#   tests/gpu/run.sh [CONFIGURE FLAGS...]      (e.g. --with-cuda=/usr/local/cuda-13.0)
# It builds with the test hooks (--enable-test-hooks): a test build, never one to install.
# $KVPAGED_GPU_PREBUILT=1: $KVPAGED_GPU_BUILD is already built (tests/gpu/bundle.sh); nothing is
# built, so the machine needs no compiler or -dev packages (tests/gpu/device.sh sets this).
# $KVPAGED_GPU_BUILD_ONLY=1: builds, runs nothing (tests/gpu/bundle.sh).
# $KVPAGED_GPU_DEADLINE: seconds the whole run may take (330).  $KVPAGED_GPU_SKIP_BENCH=1: no
# benchmark (for the driver emulation, where its numbers mean nothing).
# Exit status: 0 all passed and every benchmark bar met; 1 something failed or missed a bar;
# 77 no GPU (the tests that need none still run and must pass).
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
build=${KVPAGED_GPU_BUILD:-$top/build-gpu}
cd "$top"
start=$SECONDS
# The programs this script runs.
gpu_programs() { echo tests/gpu/test-gpu-backend tests/gpu/test-gpu-share tests/gpu/test-nodriver tests/gpu/kvpaged-gpu-bench kvpaged kvpagedctl; }

if [ "${KVPAGED_GPU_PREBUILT:-0}" = 1 ]; then
	echo "== prebuilt: $build ($(cat "$build/../commit" 2>/dev/null || echo 'commit unknown'))"
	[ -x "$build/tests/gpu/test-gpu-backend" ] || {
		echo "gpu: $build has no tests/gpu/test-gpu-backend (tests/gpu/bundle.sh builds it)"
		exit 1
	}
else
	flags=("$@")
	printf '%s\n' "${flags[@]}" | grep -q -- '--with-cuda' || flags+=(--with-cuda)
	echo "== build ($build: ${flags[*]})"
	# The test hooks: the GPU tests force each swap path through one.
	if ! scripts/build.sh "$build" --enable-werror --enable-test-hooks "${flags[@]}" \
		>"$top/gpu-build.log" 2>&1; then
		tail -40 "$top/gpu-build.log"
		echo "gpu: build failed"
		exit 1
	fi
	make -C "$build" -s -j"$(nproc)" $(gpu_programs) >>"$top/gpu-build.log" 2>&1 || {
		tail -40 "$top/gpu-build.log"
		echo "gpu: building the tests failed"
		exit 1
	}
	rm -f "$top/gpu-build.log"
	[ "${KVPAGED_GPU_BUILD_ONLY:-0}" = 1 ] && exit 0
fi

# The module the tests name in their pools' backend_module (the daemon reads no variable for it).
export KVPAGED_TEST_CUDA_MODULE=$build/.libs/kvpaged-cuda.so
export KVPAGED_BIN=$build/kvpaged KVPAGEDCTL_BIN=$build/kvpagedctl
export abs_top_builddir=$build srcdir=$top CK_DEFAULT_TIMEOUT=120
# Each test case gets 60 s (its 120 halved), and a daemon 30 s to start (a cold driver).
export CK_TIMEOUT_MULTIPLIER=0.5 KVPAGED_TEST_START_S=30

# The whole run ends by $KVPAGED_GPU_DEADLINE seconds (default 330): a lent machine's command
# has a hard limit, and logs written before it are the ones that come back.
deadline=${KVPAGED_GPU_DEADLINE:-330}
passed=() failed=() skipped=() hung=()
run() { # NAME TIMEOUT COMMAND...: one test, its output kept in $build/gpu-NAME.log
	local name=$1 limit=$2 rc left
	shift 2
	left=$((deadline - (SECONDS - start) - 10))
	[ "$limit" -le "$left" ] || limit=$left
	if [ "$limit" -lt 10 ]; then
		echo "== $name: not run, no time left"
		failed+=("$name(not-run)")
		return 1
	fi
	echo "== $name"
	# Check writes each case's result to the TAP file as it ends: a hang still says where.
	rm -f "$build/gpu-$name.tap"
	(cd "$build" && CK_TAP_LOG_FILE_NAME="$build/gpu-$name.tap" timeout "$limit" "$@") \
		>"$build/gpu-$name.log" 2>&1
	rc=$?
	case $name:$rc in
	*:0) passed+=("$name") ;;
	*:77) skipped+=("$name"); grep -m1 SKIP "$build/gpu-$name.log" ;;
	bench:1) ;; # it ran; a bar was missed (the summary says so)
	*)
		failed+=("$name")
		[ $rc -eq 124 ] && echo "$name: killed after $limit s" && hung+=("$name")
		tail -30 "$build/gpu-$name.log"
		[ -s "$build/gpu-$name.tap" ] && grep -v '^ok' "$build/gpu-$name.tap" | head -20
		;;
	esac
	return $rc
}

run nodriver 60 ./tests/gpu/test-nodriver
run nolink 30 "$top/tests/gpu/nolink.test"
run gpu-backend 180 ./tests/gpu/test-gpu-backend
gpu=yes
case " ${skipped[*]-} " in *" gpu-backend "*) gpu=no ;; esac
bench_rc=0
if [ $gpu = yes ]; then
	# Before the share test: the numbers come back even if a later test hangs.
	# ($KVPAGED_GPU_SKIP_BENCH=1: not run, for the driver emulation, where it means nothing.)
	if [ "${KVPAGED_GPU_SKIP_BENCH:-0}" = 1 ]; then
		bench_rc=skipped
	else
		run bench 150 ./tests/gpu/kvpaged-gpu-bench
		bench_rc=$?
		case $bench_rc in 0 | 1) sed -n '/^7B geometry/,$p' "$build/gpu-bench.log" ;; esac
	fi
	run gpu-share 240 ./tests/gpu/test-gpu-share
	# A GPU test that failed (not hung) runs again under compute-sanitizer's memcheck, while
	# the time allows: one lent run must say as much as it can.
	sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
	for t in gpu-backend gpu-share; do
		case " ${failed[*]-} " in *" $t "*) ;; *) continue ;; esac
		case " ${hung[*]-} " in *" $t "*) continue ;; esac
		[ -n "$sanitizer" ] || { echo "gpu: no compute-sanitizer for $t"; break; }
		left=$((deadline - (SECONDS - start) - 10))
		[ $left -ge 60 ] || { echo "gpu: no time left to run $t under compute-sanitizer"; break; }
		echo "== $t under compute-sanitizer (memcheck; not counted)"
		(cd "$build" && timeout "$left" "$sanitizer" --tool memcheck --target-processes all \
			--print-limit 50 "./tests/gpu/test-$t") >"$build/gpu-$t-memcheck.log" 2>&1
		echo "$t under memcheck exited $?"
		grep -E '^========= (ERROR SUMMARY|Invalid|Program hit)' "$build/gpu-$t-memcheck.log" | head -10
	done
fi

echo
if [ $gpu = no ]; then
	echo "gpu: no GPU here: ${#passed[@]} passed (${passed[*]-}), ${#failed[@]} failed (${failed[*]-}) of the tests that need none; $((SECONDS - start)) s"
	[ ${#failed[@]} -eq 0 ] && exit 77
	exit 1
fi
echo "gpu: ${#passed[@]} passed (${passed[*]-}), ${#failed[@]} failed (${failed[*]-}), ${#skipped[@]} skipped (${skipped[*]-}); benchmark bars $(case $bench_rc in 0) echo met ;; 1) echo MISSED ;; skipped) echo "not measured (skipped)" ;; *) echo "not measured (exit $bench_rc)" ;; esac); $((SECONDS - start)) s"
[ ${#failed[@]} -eq 0 ] && [ "$bench_rc" != 1 ]
