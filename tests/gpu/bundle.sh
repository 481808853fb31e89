#!/usr/bin/env bash
# Builds, on this machine, everything tests/gpu/run.sh runs, so that a GPU machine with no
# compiler, autotools or -dev packages can run it (tests/gpu/device.sh there).
#   tests/gpu/bundle.sh [DIR]          (default: .gpu/ in the source tree, ignored by git)
# DIR/build     the build (--with-cuda), its programs, the module and libkvpaged
# DIR/lib       the shared libraries those need beyond glibc, copied from this machine
# DIR/build-path the build's absolute path here: libtool's wrappers name it, so the GPU machine
#               links it to where the bundle landed (device.sh does)
# DIR/commit    what was built (a '+' marks uncommitted changes)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$top/.gpu}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$top"

# run.sh's own build of what it runs.
KVPAGED_GPU_BUILD=$out/build KVPAGED_GPU_BUILD_ONLY=1 tests/gpu/run.sh

# Every ELF object that runs, and what it needs beyond the C library (which the GPU machine has,
# at least as new: nothing here needs more than the glibc this was built with).
rm -rf "$out/lib"
mkdir -p "$out/lib"
elves=$(find "$out/build" -type f \( -perm -u+x -o -name '*.so*' \) ! -name '*.o' ! -name '*.la' \
	-exec sh -c 'head -c4 "$1" | grep -q ELF && echo "$1"' _ {} \;)
for f in $elves; do
	ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
	case $soname in
	libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) ;;
	libkvpaged.so.* | libkvproto.so.*) ;; # in the build
	*) cp -L "$path" "$out/lib/$soname" ;;
	esac
done

echo "$out/build" >"$out/build-path"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit+"
echo "$commit" >"$out/commit"
glibc=$(for f in $elves; do objdump -T "$f" 2>/dev/null; done | grep -o 'GLIBC_2\.[0-9.]*' | sort -uV | tail -1)
echo "$glibc" >"$out/glibc"
echo "bundle: $out ($commit, $(du -sh "$out" | cut -f1), needs $glibc; libraries: $(ls "$out/lib" | tr '\n' ' '))"
