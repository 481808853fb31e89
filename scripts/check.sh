#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs dependencies, builds with -Werror, runs every
# test, runs the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer, checks
# the distribution tarball, and ends with one line 'N passed, N failed'.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

"$top/scripts/deps.sh" || exit 1

passed=0
failed=0
count() { # DIR: add the automake harness results of DIR
	local log="$1/test-suite.log" p f
	p=$(sed -n 's/^# PASS: *//p' "$log" 2>/dev/null | head -1)
	f=$(sed -n 's/^# FAIL: *//p;s/^# ERROR: *//p' "$log" 2>/dev/null | awk '{s+=$1} END {print s+0}')
	passed=$((passed + ${p:-0}))
	failed=$((failed + ${f:-0}))
}
run_suite() { # NAME DIR MAKE-ARGS...: build and test in DIR
	local name=$1 dir=$2
	shift 2
	echo "== $name"
	if ! make -C "$dir" -s -j"$(nproc)" check "$@"; then
		cat "$dir/test-suite.log" 2>/dev/null | tail -100
		count "$dir"
		[ -f "$dir/test-suite.log" ] || failed=$((failed + 1))
		return 1
	fi
	count "$dir"
}

status=0
echo "== build (-Werror)"
scripts/build.sh build --enable-werror --enable-test-hooks || exit 1
run_suite "tests" build || status=1

# The CUDA backend compiles and links wherever nvcc is (no GPU or driver needed); its tests
# here prove the no-driver paths (the GPU tests skip), then run the GPU tests under the driver
# emulation (fakecuda.test).  On a GPU: tests/gpu/run.sh.
echo "== build with the CUDA backend (--with-cuda: compile and link)"
nvcc_path=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -z "$nvcc_path" ]; then
	echo "SKIP: nvcc not found: the CUDA backend is not compiled (install the CUDA toolkit)"
elif scripts/build.sh build-cuda --enable-werror --enable-test-hooks --with-cuda; then
	run_suite "CUDA backend without a driver" build-cuda \
		TESTS="tests/gpu/nolink.test tests/gpu/test-nodriver tests/gpu/test-gpu-backend tests/gpu/test-gpu-share tests/gpu/fakecuda.test" ||
		status=1
	# What a lent GPU machine runs, built here and moved, as the device tool moves it.
	echo "== GPU bundle (tests/gpu/bundle.sh, tests/gpu/device.sh)"
	if tests/gpu/bundle-check.sh; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
		status=1
	fi
else
	failed=$((failed + 1))
	status=1
fi

echo "== build (AddressSanitizer + UndefinedBehaviorSanitizer)"
scripts/build.sh build-asan --enable-werror --enable-test-hooks --enable-sanitizers || exit 1
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	run_suite "tests under sanitizers" build-asan || status=1

echo "== fuzzers (libFuzzer, ${KVPAGED_FUZZ_SECONDS:=30} s each)"
if scripts/build.sh build-fuzz CC=clang --enable-fuzzers --enable-werror; then
	for target in fuzz-frame fuzz-ring; do
		corpus=build-fuzz/corpus-$target
		mkdir -p "$corpus"
		if (cd build-fuzz && ./tests/fuzz/$target -max_total_time="$KVPAGED_FUZZ_SECONDS" \
			-print_final_stats=1 "../$corpus" >"$target.log" 2>&1); then
			echo "PASS: $target ($(sed -n 's/^stat::number_of_executed_units: *//p' build-fuzz/$target.log) inputs)"
			passed=$((passed + 1))
		else
			tail -40 "build-fuzz/$target.log"
			echo "FAIL: $target"
			failed=$((failed + 1))
			status=1
		fi
	done
else
	failed=$((failed + 1))
	status=1
fi

echo "== distcheck"
if ! make -C build -s distcheck DISTCHECK_CONFIGURE_FLAGS="--enable-werror --enable-test-hooks" >build/distcheck.log 2>&1; then
	tail -60 build/distcheck.log
	failed=$((failed + 1))
	status=1
fi

echo
echo "check: $passed passed, $failed failed"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
