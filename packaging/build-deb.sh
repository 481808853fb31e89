#!/usr/bin/env bash
# Builds the Debian packages kvpaged, libkvpaged1 and libkvpaged-dev from a release tarball
# (make dist) or an unpacked release tree, with packaging/debian as debian/:
#
#   packaging/build-deb.sh kvpaged-0.3.0.tar.gz [OUTDIR]
#
# The .deb, .changes and .buildinfo files land in OUTDIR (default: the current directory).
# Needs dpkg-dev, debhelper and the Build-Depends of packaging/debian/control (scripts/deps.sh
# installs them).  DEB_BUILD_OPTIONS is passed on (nocheck skips the test suite); the build
# runs in parallel on every CPU unless it says otherwise.  The packages are production builds:
# debian/rules configures them without the test hooks, whatever the tree was configured with.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=${1:?usage: build-deb.sh TARBALL|DIR [OUTDIR]}
out=$(mkdir -p "${2:-.}" && cd "${2:-.}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvpaged-deb-XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ -d "$src" ]; then
	cp -a "$src" "$work/kvpaged"
else
	mkdir "$work/kvpaged"
	tar -xf "$src" -C "$work/kvpaged" --strip-components=1
fi
tree=$work/kvpaged
rm -rf "$tree/debian"
# The debian/ of the tree being built, else the one beside this script.
if [ -d "$tree/packaging/debian" ]; then
	cp -a "$tree/packaging/debian" "$tree/debian"
else
	cp -a "$here/debian" "$tree/debian"
fi
case " ${DEB_BUILD_OPTIONS:-} " in
*" parallel="*) ;;
*) export DEB_BUILD_OPTIONS="${DEB_BUILD_OPTIONS:-} parallel=$(nproc)" ;;
esac
(cd "$tree" && dpkg-buildpackage -b -us -uc)
cp "$work"/*.deb "$work"/*.changes "$work"/*.buildinfo "$out/"
ls "$out"/*.deb
