#!/bin/sh
# The C libraries the plugin links besides the pip wheels (c-blosc2 and libcrc32c come from the blosc2
# and google-crc32c wheels): the codec libraries of csrc/kernels/codecs.cc, libcurl and expat (remote storage).
# Called by the Makefile before the plugin is built:
#   - every library found (header + library, by the C compiler's own search): nothing printed;
#   - some missing, running as root with apt-get: their Debian -dev packages installed quietly, one line
#     saying so (DALI_MESH_SYSTEM_LIBS=0: never install);
#   - otherwise: one line per missing library naming what falls back.
# Writes the libraries found to STATE (argument) only when that list changed, so that the Makefile
# rebuilds the plugin when a library appears or disappears, and prints the lines only then.
set -u
state="${1:-}"
cc="${CC:-cc}"
command -v "$cc" >/dev/null 2>&1 || cc=gcc

# header  library  Debian package  what falls back without it
table='zstd.h|zstd|libzstd-dev|Zstd chunks (zarr-python 3 default codec) are decoded by Python workers (partitioned_source)
lz4.h|lz4|liblz4-dev|LZ4 chunks are decoded by Python workers (partitioned_source)
zlib.h|z|zlib1g-dev|zlib/gzip chunks are decoded by Python workers unless libdeflate is found
libdeflate.h|deflate|libdeflate-dev|zlib/gzip chunks are inflated by zlib (about 2x slower)
liblzf/lzf.h|lzf|liblzf-dev|LZF chunks (HDF5 lzf filter) are decoded by Python workers (partitioned_source)
szlib.h|sz|libaec-dev|szip chunks (HDF5 szip filter) are decoded by Python workers (partitioned_source)
curl/curl.h|curl|libcurl4-openssl-dev|remote stores (s3://, gs://, https://) cannot be read (their locations are refused)
expat.h|expat|libexpat1-dev|remote stores (s3://, gs://, https://) cannot be read (their locations are refused; expat reads their XML)'

have() {  # header, library: compiles and links a program using them
  printf '#include <%s>\nint main(void) { return 0; }\n' "$1" |
    "$cc" -x c - -o /dev/null "-l$2" >/dev/null 2>&1
}

missing() {
  echo "$table" | while IFS='|' read -r h l p why; do have "$h" "$l" || echo "$h|$l|$p|$why"; done
}

gone="$(missing)"
if [ -n "$gone" ] && [ "${DALI_MESH_SYSTEM_LIBS:-1}" != 0 ] && [ "$(id -u)" = 0 ] \
   && command -v apt-get >/dev/null 2>&1; then
  pkgs="$(echo "$gone" | cut -d'|' -f3 | tr '\n' ' ')"
  echo "dali_mesh: installing ${pkgs}with apt-get (C libraries the plugin links; DALI_MESH_SYSTEM_LIBS=0 to skip)"
  export DEBIAN_FRONTEND=noninteractive
  # shellcheck disable=SC2086
  apt-get install -y -q --no-install-recommends $pkgs >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends $pkgs >/dev/null 2>&1; } \
    || echo "dali_mesh: apt-get install $pkgs failed"
  gone="$(missing)"
fi

found="$(echo "$table" | cut -d'|' -f2 | while read -r l; do
  echo "$gone" | cut -d'|' -f2 | grep -qx "$l" || printf '%s ' "$l"; done)"
if [ -z "$state" ] || [ "$(cat "$state" 2>/dev/null)" != "found: $found" ]; then
  if [ -n "$gone" ]; then
    echo "$gone" | while IFS='|' read -r h l p why; do
      echo "dali_mesh: lib$l not found (<$h>; Debian/Ubuntu: $p): $why"
    done
  fi
  if [ -n "$state" ]; then
    mkdir -p "$(dirname "$state")"
    echo "found: $found" > "$state"
  fi
fi
exit 0
