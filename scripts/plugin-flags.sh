#!/usr/bin/env bash
# Prints the plugin's build flags for glibc 2.17 and later, one per line:
# more CGO_CFLAGS, build tags, more -ldflags. Every C file includes
# packaging/glibc-compat.h, which binds glibc's functions to their first
# versions; the binary links to libdl and libpthread, where glibc before 2.34
# has them; Go's own DNS and user lookups need none of glibc's newer
# functions. The header's hash is in the flags, so that Go's build cache
# sees a change to it. scripts/release.sh and the tests' plugin builds
# (testcluster.PluginBinary) use them.
set -euo pipefail
header=$(cd "$(dirname "$0")/.." && pwd)/packaging/glibc-compat.h
echo "-include $header -DNOMAD_GPU_GLIBC_COMPAT=$(sha256sum "$header" | cut -c1-16)"
echo "netgo,osusergo"
echo "-extldflags '-Wl,--no-as-needed -l:libdl.so.2 -l:libpthread.so.0'"
