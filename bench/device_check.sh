#!/usr/bin/env bash
# The device check a machine with an accelerator runs (issue 41, item 4): builds chorus, says which memory
# spaces this process can use, runs the device collective tests on the accelerator's OpenCL device, and
# bench/device_ab.sh: paired, interleaved chorus-bench sweeps of allreduce on device buffers under each staging
# mode next to the same sweep on host buffers (2 and 4 ranks sharing the device, shared memory).  No network;
# about 5-7 minutes on 16 cores (34 s here on POCL with --np 2 --repeats 1 and no build).
#
#   bash bench/device_check.sh [--build DIR] [--np 2,4] [--repeats 3] [--out DIR] [--no-build]
#
# Which OpenCL device: NVIDIA's driver ships an OpenCL ICD (/etc/OpenCL/vendors/nvidia.icd): when it is there
# the script points the ICD loader at it alone (OCL_ICD_VENDORS), so the tests and the bench use the GPU and not
# POCL's CPU device; otherwise whatever the loader finds first (DEVICE_CHECK_ICD=path overrides).
#
# CUDA: chorus loads libcuda.so.1 at run time (chorusMemSpaceQuery, the bench's header).  Where it finds a driver
# and a device, the script runs device_cuda_test over the real driver (CHORUS_CUDA_DRIVER=libcuda.so.1; in CI the
# same tests run over tests/fake_cuda's test double) and adds `cuda` (chorus-bench --memory cuda) to the paired
# sweeps; otherwise it records why not.  Everything goes to DIR (default a fresh /tmp/device_check.XXXXXX) and a summary to stdout; put the
# summary in docs/performance.md with the GPU named.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$here/build-device nps=2,4 repeats=3 out= do_build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    --np) nps=$2; shift ;;
    --repeats) repeats=$2; shift ;;
    --out) out=$2; shift ;;
    --no-build) do_build=0 ;;
    *) echo "device_check.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/device_check.XXXXXX")
mkdir -p "$out"
log() { echo "$*" | tee -a "$out/summary.txt"; }
start=$(date +%s)

log "# device_check.sh $(date -u +%FT%TZ) on $(hostname), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/# gpu: /' | tee -a "$out/summary.txt"
else
  log "# gpu: no nvidia-smi"
fi
icd=${DEVICE_CHECK_ICD:-}
[ -z "$icd" ] && [ -f /etc/OpenCL/vendors/nvidia.icd ] && icd=/etc/OpenCL/vendors/nvidia.icd
if [ -n "$icd" ]; then
  export OCL_ICD_VENDORS=$icd
  log "# OpenCL ICD: $icd only (OCL_ICD_VENDORS)"
fi
command -v clinfo >/dev/null 2>&1 && clinfo -l 2>&1 | sed 's/^/# clinfo: /' | tee -a "$out/summary.txt"

# 1. Build (ccache when present), only what the check runs.
if [ "$do_build" = 1 ]; then
  for t in cmake ninja c++; do
    command -v $t >/dev/null 2>&1 || { log "FAIL: no $t on this machine (scripts/setup.sh installs the toolchain)"; exit 1; }
  done
  launcher=()
  command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  if ! { cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" &&
         ninja -C "$build" chorus-bench chorus-run device_opencl_test device_cuda_test; } >"$out/build.log" 2>&1; then
    log "FAIL: the build failed (tail of $out/build.log below)"
    tail -20 "$out/build.log"
    exit 1
  fi
  log "# built in $(( $(date +%s) - start )) s"
fi
bench=$build/tools/chorus-bench
run=$build/tools/chorus-run

# 2. The memory spaces this chorus can use (one line per space).
"$run" --print-env 2>&1 | grep -iE 'memory space|opencl|cuda' | sed 's/^/# /' | tee -a "$out/summary.txt"

# 3. The device collective tests (every collective, dtype and op; 1-8 ranks; each staging mode).
if timeout 240 "$build/tests/device_opencl_test" >"$out/device_opencl_test.log" 2>&1; then
  log "tests: device_opencl_test passed ($(grep -c '^\[       OK \]' "$out/device_opencl_test.log") tests ok," \
      "$(grep -c '^\[  SKIPPED \]' "$out/device_opencl_test.log") skipped)"
else
  log "FAIL: device_opencl_test (see $out/device_opencl_test.log)"
  grep -E '^\[  FAILED  \]|Failure' "$out/device_opencl_test.log" | head -10 | tee -a "$out/summary.txt"
fi

# 3b. The CUDA data path over the real driver, where there is one.
modes=pipeline,map,whole
cuda_why=$("$run" --print-env 2>&1 | grep -iE '^ *cuda' | head -1)
if python3 - <<'PY'
import ctypes, sys
try:
    lib = ctypes.CDLL("libcuda.so.1")
    n = ctypes.c_int(0)
    sys.exit(0 if lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value > 0 else 1)
except OSError:
    sys.exit(1)
PY
then
  modes=$modes,cuda
  if CHORUS_CUDA_DRIVER=libcuda.so.1 timeout 240 "$build/tests/device_cuda_test" >"$out/device_cuda_test.log" 2>&1; then
    log "tests: device_cuda_test passed on the real driver ($(grep -c '^\[       OK \]' "$out/device_cuda_test.log") ok," \
        "$(grep -c '^\[  SKIPPED \]' "$out/device_cuda_test.log") skipped)"
  else
    log "FAIL: device_cuda_test on the real driver (see $out/device_cuda_test.log)"
    grep -E '^\[  FAILED  \]|Failure' "$out/device_cuda_test.log" | head -10 | tee -a "$out/summary.txt"
  fi
else
  log "cuda: no driver with a device here (${cuda_why:-chorus-run --print-env says nothing}); CUDA path not run"
fi

# 4. Paired, interleaved sweeps (bench/device_ab.sh): host, then each staging mode (and cuda), rotated every
#    repeat; medians and paired ratios.  On a discrete GPU auto is pipeline.
bash "$here/bench/device_ab.sh" --build "$build" --modes "$modes" --np "$nps" --repeats "$repeats" \
  --iters 10 --sizes 1M,64M,4 --out "$out/ab" 2>&1 | tee -a "$out/summary.txt"
grep -h '^# buffers' "$out"/ab/map.np*.large.r1.txt 2>/dev/null | sort -u | tee -a "$out/summary.txt"
grep -h '^# buffers' "$out"/ab/cuda.np*.large.r1.txt 2>/dev/null | sort -u | tee -a "$out/summary.txt"
[ -f "$out/errors.txt" ] && { log "errors:"; tee -a "$out/summary.txt" <"$out/errors.txt"; }
log "# done in $(( $(date +%s) - start )) s; raw rows in $out"
