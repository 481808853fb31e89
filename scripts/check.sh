#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs dependencies, builds with -Werror (and the test
# hooks), runs every test, runs them again under AddressSanitizer + UndefinedBehaviorSanitizer,
# checks the distribution tarball, and ends with one line 'check: N passed, N failed, N
# skipped', after the list of what was skipped and why.
#
# Run as root (as CI runs .ci/run), a skip is a failure: on a Debian 12 root machine every test
# can run, except those in allowed_skips below.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

"$top/scripts/deps.sh" || exit 1

# The skips a Debian 12 root machine may have: 'NAME|REASON' (extended regular expressions; a
# skip is allowed when both match).  Nothing else: a test that skips for another reason, or
# any other test that skips, fails the run as root.
allowed_skips=(
	# A GPU and its driver.  Without them fakecuda.test runs both on the driver emulation
	# (and must pass), and tests/gpu/run.sh runs them on a GPU machine.
	'tests/gpu/test-gpu-backend|no CUDA (driver|device)'
	'tests/gpu/test-gpu-share|no CUDA (driver|device)'
	# The CUDA toolkit (nvcc), which Debian 12 has only in non-free.
	'CUDA backend build|nvcc not found'
)

passed=0
failed=0
skipped=0
skip_lines=()
# skip SUITE NAME REASON: one skip, counted by the rule above.
skip() {
	local suite=$1 name=$2 reason=$3 rule verdict=skipped

	if [ "$(id -u)" -eq 0 ]; then
		verdict="FAILED (a skip as root)"
		for rule in "${allowed_skips[@]}"; do
			if [[ $name =~ ^${rule%%|*}$ && $reason =~ ${rule#*|} ]]; then
				verdict="skipped (allowed as root)"
				break
			fi
		done
	fi
	case $verdict in
	FAILED*) failed=$((failed + 1)) ;;
	*) skipped=$((skipped + 1)) ;;
	esac
	skip_lines+=("$verdict: $name ($suite): $reason")
}
count() { # SUITE DIR: add the automake harness results of DIR, and its skips with their reasons
	local suite=$1 log="$2/test-suite.log" p f name reason

	p=$(sed -n 's/^# PASS: *//p;s/^# XFAIL: *//p' "$log" 2>/dev/null | awk '{s+=$1} END {print s+0}')
	f=$(sed -n 's/^# FAIL: *//p;s/^# ERROR: *//p;s/^# XPASS: *//p' "$log" 2>/dev/null |
		awk '{s+=$1} END {print s+0}')
	passed=$((passed + ${p:-0}))
	failed=$((failed + ${f:-0}))
	# Each skipped test's section in the log: 'SKIP: NAME', a rule, its output, and
	# 'SKIP NAME (exit status: 77)'; the reason is its 'SKIP: ...' line, else its first line.
	while IFS=$'\t' read -r name reason; do
		skip "$suite" "$name" "$reason"
	done < <(awk '
		in_skip == 0 && /^SKIP: / { header = substr($0, 7); next }
		in_skip == 0 && header != "" && /^=+$/ { in_skip = 1; reason = ""; first = ""; next }
		in_skip == 0 { header = ""; next }
		/^SKIP .*\(exit status: [0-9]+\)$/ {
			name = $2
			print name "\t" (reason != "" ? reason : first != "" ? first : "no reason given")
			in_skip = 0; header = ""; next
		}
		/^SKIP: / && reason == "" { reason = substr($0, 7); next }
		NF && first == "" { first = $0 }
	' "$log" 2>/dev/null)
}
run_suite() { # NAME DIR MAKE-ARGS...: build and test in DIR
	local name=$1 dir=$2
	shift 2
	echo "== $name"
	rm -f "$dir/test-suite.log"
	if ! make -C "$dir" -s -j"$(nproc)" check "$@"; then
		cat "$dir/test-suite.log" 2>/dev/null | tail -100
		count "$name" "$dir"
		[ -f "$dir/test-suite.log" ] || failed=$((failed + 1))
		return 1
	fi
	count "$name" "$dir"
}

# boot.test's root file system (debootstrap, about a minute) is built once, under build/, and
# shared by every suite below.
export KVPAGED_BOOT_CACHE="$top/build/tests/ops/boot-root"

status=0
echo "== build (-Werror)"
scripts/build.sh build --enable-werror --enable-test-hooks || exit 1
run_suite "tests" build || status=1

# The reliability script's short mode, on the build just tested: 1,000 clients SIGKILLed under
# load, an idle flood from another uid, fds running out (tests/stress/stress.sh; by hand it
# does more kills, or a soak).
echo "== stress (tests/stress/stress.sh --short)"
if tests/stress/stress.sh --short build 2>&1 | tee build/stress.log; then
	passed=$((passed + 1))
else
	failed=$((failed + 1))
	status=1
fi
while read -r phase; do
	skip stress "tests/stress/stress.sh" "$phase"
done < <(sed -n 's/^== \(.*SKIPPED.*\)$/\1/p' build/stress.log)

# The CUDA backend compiles and links wherever nvcc is (no GPU or driver needed); its tests
# here prove the no-driver paths (the GPU tests skip), then run the GPU tests under the driver
# emulation (fakecuda.test).  On a GPU: tests/gpu/run.sh.
echo "== build with the CUDA backend (--with-cuda: compile and link)"
nvcc_path=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -z "$nvcc_path" ]; then
	echo "SKIP: nvcc not found: the CUDA backend is not compiled (install the CUDA toolkit)"
	skip check.sh "CUDA backend build" "nvcc not found (install the CUDA toolkit)"
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
	for target in fuzz-frame fuzz-ring fuzz-config fuzz-remote; do
		# Each run starts from the committed seeds (tests/fuzz/corpus/TARGET) and from what
		# earlier runs here added: libFuzzer reads both and writes new inputs to the first,
		# build-fuzz's, only.  (-max_len: a ring input is a tail, 16 entries and a 4 KiB data
		# area.)
		corpus=build-fuzz/corpus-$target
		mkdir -p "$corpus"
		if (cd build-fuzz && ./tests/fuzz/$target -max_total_time="$KVPAGED_FUZZ_SECONDS" \
			-max_len=5124 -print_final_stats=1 "../$corpus" "../tests/fuzz/corpus/$target" \
			>"$target.log" 2>&1); then
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
if make -C build -s distcheck DISTCHECK_CONFIGURE_FLAGS="--enable-werror --enable-test-hooks" \
	>build/distcheck.log 2>&1; then
	echo "PASS: distcheck"
	passed=$((passed + 1))
else
	tail -60 build/distcheck.log
	failed=$((failed + 1))
	status=1
fi
# Its tree is gone once it passed: the skips are in its output, their reasons are not.
while read -r name; do
	skip distcheck "$name" "(its reason is in the test's log under distcheck's tree)"
done < <(sed -n 's/^SKIP: //p' build/distcheck.log)

echo
for line in ${skip_lines[@]+"${skip_lines[@]}"}; do
	echo "$line"
done
echo "check: $passed passed, $failed failed, $skipped skipped"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
