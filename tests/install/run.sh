#!/usr/bin/env bash
# The install test (CTest test_install): installs the kdloss build BUILD_DIR into a temporary
# prefix, checks what landed there, then builds tests/install/consumer.c against the installed
# package twice, through find_package(kdloss CONFIG) and through pkg-config, and runs both.
# Usage: run.sh BUILD_DIR [C_COMPILER]. Exits non-zero on any failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
cc=${2:-cc}
work=$(mktemp -d "${TMPDIR:-/tmp}/kdloss-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "test_install: FAIL: $*" >&2; exit 1; }

echo "== cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }

# ---- what was installed ----
[ -f "$prefix/include/kdloss.h" ] || fail "include/kdloss.h not installed"
pc=$(find "$prefix" -name kdloss.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "kdloss.pc not installed"
libdir=$(dirname "$(dirname "$pc")")
[ -f "$libdir/cmake/kdloss/kdlossConfig.cmake" ] || fail "kdlossConfig.cmake not in $libdir/cmake/kdloss"
[ -f "$libdir/cmake/kdloss/kdlossConfigVersion.cmake" ] || fail "kdlossConfigVersion.cmake missing"
[ -L "$libdir/libkdloss.so" ] || fail "$libdir/libkdloss.so is not the development symlink"
real=$(readlink -f "$libdir/libkdloss.so")
soname=$(readelf -d "$real" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
case "$soname" in
    libkdloss.so.[0-9]*) ;;
    *) fail "SONAME of $(basename "$real") is '$soname', expected libkdloss.so.N" ;;
esac
[ -e "$libdir/$soname" ] || fail "no $soname link next to the library"
echo "installed: $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"
echo "SONAME $soname"

# The library's private dependencies must not reach consumers: no OpenMP, BLAS or libm in the
# exported target, no -fopenmp in pkg-config's flags.
# (kdloss_cuda, the CUDA library's own target name, is not a dependency)
if grep -v '^[[:space:]]*#' "$libdir"/cmake/kdloss/kdlossTargets*.cmake | sed 's/kdloss_cuda//g' |
    grep -i -E 'openmp|gomp|blas|dnnl|sleef|cuda'; then
    fail "the exported CMake package names a private dependency of the library (lines above)"
fi

# ---- 1. CMake: find_package(kdloss CONFIG REQUIRED) + kdloss::kdloss ----
echo "== find_package consumer"
cmake -S "$here" -B "$work/cmake-consumer" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 \
    || { cat "$work/configure.log"; fail "configuring the find_package consumer"; }
grep -q "from $libdir/cmake/kdloss" "$work/configure.log" \
    || { cat "$work/configure.log"; fail "find_package did not pick the package in $prefix"; }
cmake --build "$work/cmake-consumer" >"$work/build.log" 2>&1 \
    || { cat "$work/build.log"; fail "building the find_package consumer"; }
# No LD_LIBRARY_PATH: CMake gives the consumer a build RPATH to the imported library.
"$work/cmake-consumer/consumer" || fail "find_package consumer"

# ---- 2. pkg-config: cc consumer.c $(pkg-config --cflags --libs kdloss) ----
echo "== pkg-config consumer"
export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
flags=$(pkg-config --cflags --libs kdloss) || fail "pkg-config --cflags --libs kdloss"
echo "pkg-config --cflags --libs kdloss: $flags"
for f in $flags; do
    case "$f" in -I*|-L*|-lkdloss) ;; *) fail "unexpected flag '$f' from pkg-config" ;; esac
done
[ "$(pkg-config --modversion kdloss)" = "$(sed -n 's/^set(PACKAGE_VERSION "\([0-9.]*\)")$/\1/p' \
    "$libdir/cmake/kdloss/kdlossConfigVersion.cmake")" ] || fail "kdloss.pc and the CMake package disagree on the version"
# shellcheck disable=SC2086  # $flags is a list of words
"$cc" -std=c11 -Wall -Wextra -Werror "$here/consumer.c" $flags -lm -o "$work/pc-consumer" \
    || fail "compiling the pkg-config consumer"
LD_LIBRARY_PATH="$(pkg-config --variable=libdir kdloss)" "$work/pc-consumer" || fail "pkg-config consumer"
echo "test_install: ok"
