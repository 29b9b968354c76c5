#!/usr/bin/env bash
# docs/msccl.md's table of RCCL's MSCCL files, priced: for each file in
# tests/data/msccl/, the imported plan and chorus's best plan for the same call
# (--algo auto --library chorus) on an H100 node (configs/clusters/h100-rail.json)
# and on an MI300X node (tests/data/topo/mi300x-rail.json: a mesh node read from
# RCCL's topo_8p_940.xml, docs/simulator.md "Mesh nodes"), at 1.5 MiB, analytical
# network.  Prints one markdown row per file (file, imported / best on each).
#
#   bench/msccl_table.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
sim=${1:-build}/tools/chorus-sim
bytes=1572864
price() {  # cluster collective gpus [plan algo] -> "time_us algo"
  local cluster=$1 coll=$2 gpus=$3
  shift 3
  local args=(collective --cluster "$cluster" --gpus "$gpus" --collective "$coll" --bytes "$bytes" --library chorus --json)
  if [[ $# -gt 0 ]]; then args+=(--plan "$1" --algo "$2"); else args+=(--algo auto); fi
  "$sim" "${args[@]}" | /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.1f %s" % (r["time_us"], r["algo"]))'
}
for f in tests/data/msccl/*.xml; do
  name=$(basename "$f" .xml)
  gpus=$(grep -o 'ngpus="[0-9]*"' "$f" | head -1 | tr -dc 0-9)
  coll=$(grep -o 'coll="[a-z]*"' "$f" | head -1 | sed 's/coll="\(.*\)"/\1/')
  row="| \`$name\` | $coll | $gpus"
  for cluster in configs/clusters/h100-rail.json tests/data/topo/mi300x-rail.json; do
    read -r t_file _ < <(price "$cluster" "$coll" "$gpus" "$f" "$name")
    read -r t_best a_best < <(price "$cluster" "$coll" "$gpus")
    row+=" | $t_file | $t_best ($a_best)"
  done
  echo "$row |"
done
