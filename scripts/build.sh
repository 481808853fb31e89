#!/usr/bin/env bash
# Configures (once) and builds kvpaged in DIR (default: build/) with extra configure flags.
#   scripts/build.sh [DIR] [CONFIGURE FLAGS...]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-build}
shift || true
cd "$top"
if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt configure ] ||
	[ -n "$(find . -name Makefile.inc -newer configure -print -quit)" ]; then
	./autogen.sh >/dev/null 2>&1 || { ./autogen.sh; exit 1; }
fi
mkdir -p "$dir"
cd "$dir"
# Reconfigure when the flags change.
want="$*"
if [ ! -f Makefile ] || [ "$(cat .configure-flags 2>/dev/null)" != "$want" ] || [ ../configure -nt Makefile ]; then
	"$top/configure" -q "$@"
	printf '%s' "$want" > .configure-flags
fi
make -s -j"$(nproc)"
