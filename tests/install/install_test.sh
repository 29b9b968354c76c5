#!/usr/bin/env bash
# Installs a built tree into a temporary prefix and uses it from outside, as a
# user would:
#   (a) a C program built with nothing but `pkg-config --cflags --libs chorus`
#       (2 ranks: fork + chorusCommInitRank from one unique id, an allreduce);
#   (b) a C++ program including chorus.hpp, built by a tiny CMake project with
#       find_package(chorus) and target chorus::chorus that sets no C++ standard
#       (the target carries cxx_std_20), run under the installed chorus-run, 3 ranks;
#   (c) the C program of (a) from a C-only CMake project linking chorus::chorus.
# Also checks the installed tree's files.  Removes the prefix on exit.
#
#   install_test.sh BUILD_DIR
set -euo pipefail

build_dir=${1:?usage: install_test.sh BUILD_DIR}
build_dir=$(cd "$build_dir" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cc=${CC:-cc}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/chorus-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

fail() {
  echo "install_test: FAILED: $*" >&2
  exit 1
}

echo "install_test: installing $build_dir into $prefix"
cmake --install "$build_dir" --prefix "$prefix" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log" >&2; fail "cmake --install"; }

# GNUInstallDirs may choose lib, lib64 or lib/<multiarch>.
libdir=$(dirname "$(find "$prefix" -name 'libchorus.so' -print -quit)")
[[ $libdir != . && -n $libdir ]] || fail "no libchorus.so under $prefix"
echo "install_test: libdir is ${libdir#"$prefix"/}"

for f in include/chorus/chorus.h bin/chorus-run bin/chorus-bench; do
  [[ -e $prefix/$f ]] || fail "$f is not installed"
done
[[ -x $prefix/bin/chorus-run && -x $prefix/bin/chorus-bench ]] || fail "installed tools are not executable"
for f in cmake/chorus/chorusConfig.cmake cmake/chorus/chorusConfigVersion.cmake pkgconfig/chorus.pc; do
  [[ -e $libdir/$f ]] || fail "${libdir#"$prefix"/}/$f is not installed"
done
if [[ -e $here/../../include/chorus/chorus.hpp ]]; then
  [[ -e $prefix/include/chorus/chorus.hpp ]] || fail "include/chorus/chorus.hpp exists in the source tree but is not installed"
fi
# The shared library must export the C ABI and nothing of the C++ core.
if command -v nm >/dev/null; then
  nm -D --defined-only "$libdir/libchorus.so" | awk '{print $3}' >"$tmp/exports"
  grep -qx chorusAllReduce "$tmp/exports" || fail "libchorus.so does not export chorusAllReduce"
  if grep -v '^chorus' "$tmp/exports" | grep -v '^$' >"$tmp/stray"; then
    fail "libchorus.so exports non-API symbols: $(head -5 "$tmp/stray" | tr '\n' ' ')"
  fi
fi

# --- (a) C via pkg-config only ------------------------------------------------
export PKG_CONFIG_PATH=$libdir/pkgconfig
flags=$(pkg-config --cflags --libs chorus) || fail "pkg-config --cflags --libs chorus"
echo "install_test: pkg-config flags: $flags"
# shellcheck disable=SC2086  # flags are words
$cc -std=c11 -Wall -Wextra -Werror -o "$tmp/hello_c" "$here/hello.c" $flags || fail "compiling hello.c with pkg-config flags"
# It must run without LD_LIBRARY_PATH (the .pc carries an rpath).
env -u LD_LIBRARY_PATH timeout 60 "$tmp/hello_c" || fail "hello_c exited with status $?"

# --- (b) C++ via find_package(chorus) -----------------------------------------
cmake -S "$here/consumer" -B "$tmp/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  >"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log" >&2; fail "configuring the find_package(chorus) consumer"; }
cmake --build "$tmp/consumer-build" >>"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log" >&2; fail "building the find_package(chorus) consumer"; }
env -u LD_LIBRARY_PATH "$prefix/bin/chorus-run" -n 3 --timeout 60 -- "$tmp/consumer-build/hello_cpp" \
  || fail "installed chorus-run -n 3 hello_cpp exited with status $?"

# --- (c) C via find_package(chorus), no C++ compiler enabled ---------------------
cmake -S "$here/c_consumer" -B "$tmp/c-consumer-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  >"$tmp/c-consumer.log" 2>&1 || { cat "$tmp/c-consumer.log" >&2; fail "configuring the C-only find_package(chorus) consumer"; }
cmake --build "$tmp/c-consumer-build" >>"$tmp/c-consumer.log" 2>&1 || { cat "$tmp/c-consumer.log" >&2; fail "building the C-only find_package(chorus) consumer"; }
env -u LD_LIBRARY_PATH timeout 60 "$tmp/c-consumer-build/hello_c_cmake" || fail "hello_c_cmake exited with status $?"

echo "install_test: ok"
