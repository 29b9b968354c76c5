#!/usr/bin/env bash
# Installs every Debian package chorus needs to build, test and benchmark.
#
# Run as root (or via sudo) on Debian 12 / Ubuntu 22.04+.  Non-interactive and
# idempotent: when every package is already installed it touches nothing and
# returns at once, so CI and re-runs can call it unconditionally.
set -euo pipefail

packages=(
  # build
  cmake ninja-build g++ pkg-config
  # libraries
  libfmt-dev libcli11-dev nlohmann-json3-dev libssl-dev
  # tests and microbenchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # network namespaces for the cluster tests (ip netns)
  iproute2
  # the job secret over mpirun/srun's PMIx exchange (headers; libpmix.so.2 is loaded at run time)
  libpmix-dev
  # the UCX transport (headers for the build, libucp and ucx_info / ucx_perftest at run time)
  libucx-dev ucx-utils
  # the libFuzzer targets of tests/fuzz (clang 14 with its sanitizer and fuzzer runtimes)
  clang libclang-rt-14-dev
  # the peers in the comparison benchmark
  openmpi-bin libopenmpi-dev mpich libmpich-dev libgloo-dev
  # plots and command timing for bench/
  python3-matplotlib hyperfine
  # the IEEE 1588 peer for chorus-ptp's interop test (ptp4l, pmc)
  linuxptp
  # the OpenCL memory space (docs/device.md): headers and ICD loader for the build, POCL (an OpenCL
  # implementation on the CPU) so that the device tests run here and in CI, clinfo, and pyopencl
  opencl-headers ocl-icd-opencl-dev pocl-opencl-icd clinfo python3-pyopencl
  # the Python package and the torch.distributed backend (python/, tests/python)
  python3-dev python3-numpy python3-torch libtorch-dev pybind11-dev python3-pybind11 python3-pytest
)

# The IPv6 loopback tests (socket_test, store_test) need ::1 on lo; a machine
# that switched IPv6 off on lo gets it back when we are root (no-op otherwise).
if [[ $(id -u) -eq 0 && -w /proc/sys/net/ipv6/conf/lo/disable_ipv6 &&
      $(cat /proc/sys/net/ipv6/conf/lo/disable_ipv6) != 0 ]]; then
  echo 0 >/proc/sys/net/ipv6/conf/lo/disable_ipv6 && echo "setup.sh: enabled IPv6 on lo"
fi

missing=()
for p in "${packages[@]}"; do
  # "install ok installed" only: a removed package keeps a dpkg record.
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup.sh: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo)
  else
    echo "setup.sh: missing packages (${missing[*]}) and not root; run as root or install sudo" >&2
    exit 1
  fi
fi

echo "setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
