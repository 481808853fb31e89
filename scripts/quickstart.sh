#!/usr/bin/env bash
# Builds kvpaged and shows what it does: replays a real serving trace (Mooncake's synthetic
# trace, when ../shared/traces is beside the checkout; a generated shared-prefix workload
# otherwise) through the block manager at a few pool sizes, beside the offline optimum.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
scripts/deps.sh
scripts/build.sh build
bench=build/kvpaged-bench
trace=${KVPAGED_TRACE:-$top/../shared/traces/mooncake/synthetic_trace.jsonl}

if [ -f "$trace" ]; then
	echo "Prefix caching on a real trace: each request's prompt is opened as a sequence; leading"
	echo "512-token blocks committed by earlier requests are reused instead of recomputed."
	echo
	"$bench" replay --trace "$trace" --block-tokens 512 --prompt-only \
		--capacity-blocks 1000,5000,10000,20000,50000 --reference belady
else
	echo "(no trace at $trace: running the generated shared-prefix workload)"
	"$bench" gsp --capacity-blocks 2000,4000,80000
fi
echo
echo "Core operations (median ns, beside raw XXH3-128 in the same run):"
"$bench" micro
