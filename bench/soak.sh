#!/usr/bin/env bash
# Soak test (not in CI: the full run takes tens of minutes): 1,000,000 8-byte
# allreduces and 10,000 16 MiB allreduces on one communicator of 4 local
# ranks, then checks that no rank's resident memory (VmRSS) grew by 1 MiB or
# more and that no rank holds one more open descriptor than after warm-up.
#
#   bash bench/soak.sh                          # the full soak
#   bash bench/soak.sh --small 20000 --large 200  # scaled down
#   options: --np N (4) --small N (1000000) --large N (10000) --large-bytes B (16777216)
#            --warmup N (100000 small allreduces before the first measurement: the
#              shm rings must wrap once so their pages are resident, otherwise
#              the first touch of ring pages, up to ~4 MiB, reads as growth)
#            --transport shm|tcp (CHORUS_TRANSPORT; default: the library's choice)
#            --no-build (use $CHORUS_BUILD_DIR's libchorus.so and tools/chorus-run as they are)
#
# Each rank (bench/soak.cpp, built here against libchorus.so) measures itself
# after a warm-up and at the end and prints one JSON line; this script
# collects them and prints a table.  Exit status 0 when every rank passes.
# Build directory: $CHORUS_BUILD_DIR (default build/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

np=4 small=1000000 large=10000 large_bytes=$((16 << 20)) warmup=100000 transport= build=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --np) np=$2; shift 2 ;;
    --small) small=$2; shift 2 ;;
    --large) large=$2; shift 2 ;;
    --large-bytes) large_bytes=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "soak.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

build_dir=${CHORUS_BUILD_DIR:-build}
if [[ $build == 1 ]]; then
  [[ -f "$build_dir/build.ninja" ]] || cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  cmake --build "$build_dir" -j "${CHORUS_JOBS:-2}" --target chorus chorus-run
fi
soak_bin=$build_dir/bench/soak
mkdir -p "$build_dir/bench"
if [[ ! -x $soak_bin || bench/soak.cpp -nt $soak_bin || $build_dir/libchorus.so -nt $soak_bin ]]; then
  g++ -std=c++20 -O2 -g -Wall -Wextra -Iinclude bench/soak.cpp -o "$soak_bin" \
    -L"$build_dir" -lchorus -Wl,-rpath,"$(cd "$build_dir" && pwd)"
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "soak: $np ranks, $small x 8 B and $large x $large_bytes B allreduces${transport:+ over $transport}"
start=$(date +%s)
env ${transport:+CHORUS_TRANSPORT=$transport} "$build_dir/tools/chorus-run" -n "$np" --no-prefix -- \
  "$soak_bin" "$small" "$large" "$large_bytes" "$warmup" | tee "$out"
echo "soak: $(( $(date +%s) - start )) s"

python3 - "$out" "$np" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
np_ = int(sys.argv[2])
ok = len(rows) == np_
if not ok:
    print(f"soak: FAIL: {len(rows)} of {np_} ranks reported")
print(f"{'rank':>4} {'VmRSS before':>12} {'after 8B':>9} {'after':>9} {'growth':>7} {'anon +':>7} {'shm +':>6} "
      f"{'fds before':>10} {'fds after':>9} {'8B us/op':>9} {'large ms/op':>11}   (memory in KiB)")
for r in sorted(rows, key=lambda r: r["rank"]):
    growth = r["rss_kib_after"] - r["rss_kib_before"]
    fd_growth = r["fds_after"] - r["fds_before"]
    small_us = 1e6 * r["small_seconds"] / max(r["small_count"], 1)
    large_ms = 1e3 * r["large_seconds"] / max(r["large_count"], 1)
    print(f"{r['rank']:>4} {r['rss_kib_before']:>12} {r['rss_kib_after_small']:>9} {r['rss_kib_after']:>9} "
          f"{growth:>7} {r['anon_kib_after'] - r['anon_kib_before']:>7} {r['shmem_kib_after'] - r['shmem_kib_before']:>6} "
          f"{r['fds_before']:>10} {r['fds_after']:>9} {small_us:>9.2f} {large_ms:>11.2f}")
    if growth >= 1024 or fd_growth > 0:
        ok = False
        print(f"soak: FAIL: rank {r['rank']} grew by {growth} KiB and {fd_growth} descriptors "
              "(limits: < 1024 KiB, 0 descriptors)")
print("soak: PASS" if ok else "soak: FAIL")
sys.exit(0 if ok else 1)
EOF
