#!/bin/sh
# Regenerates the build system from configure.ac and the Makefile.am/.inc files.
set -e
cd "$(dirname "$0")"
autoreconf --force --install --warnings=all
