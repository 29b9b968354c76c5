#!/usr/bin/env bash
# The tuner's cost model against this machine, measured as a new user would (issue 35 item 3):
# `chorus-tune` writes a profile, then `chorus-bench --algo all` times every allreduce algorithm at each
# size (the algorithms in turn at every size: interleaved) and prints the cost model's prediction beside
# each time (predicted_us).  The whole sweep — every (ranks, transport) — is repeated --repeats times, the
# order of the (ranks, transport) jobs rotated between repeats (paired: every cell measured once per repeat).
#
# Per (ranks, transport, algorithm) it prints
#   err    the geometric-mean error of the prediction against the median of the repeats, over the sizes
#          (exp(mean |ln(pred / measured)|) - 1)
#   noise  the repeat-to-repeat noise of the measurement: the geometric-mean deviation of one repeat from
#          the median of the repeats, over the sizes and repeats (same formula, a repeat for pred)
#   verdict  ok (err <= 15 %), noise (err above 15 % but <= noise: the model sits inside the noise) or MISS
# and the load average before and after (the VM's other work is the noise's main source).
#
# By default the profile carries the α-β-γ figures only (`chorus-tune --collectives none`): the check is of
# the model, whose terms chorus-tune's microbenchmarks measure.  --corrections also lets chorus-tune
# measure its per-algorithm correction factors (docs/algorithms.md, "Measured corrections"), which are
# themselves timings of this sweep's calls: the check is then of the calibration's reproducibility.
#
#   bash bench/cost_model_check.sh [--build DIR] [--np 2,4] [--transports shm,tcp] [--repeats 3]
#        [--min 64K] [--max 16M] [--out DIR] [--profile FILE] [--corrections] [--report DIR]
#
# --profile FILE skips chorus-tune and uses FILE; --report DIR re-analyses an earlier run's DIR.
set -euo pipefail

BUILD=build NP=2,4 TRANSPORTS=shm,tcp REPEATS=3 MIN=64K MAX=16M OUT="" PROFILE="" CORR=0 REPORT=""
die() { echo "cost_model_check: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --np) NP=$2; shift 2 ;;
    --transports) TRANSPORTS=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --min) MIN=$2; shift 2 ;;
    --max) MAX=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --profile) PROFILE=$2; shift 2 ;;
    --corrections) CORR=1; shift ;;
    --report) REPORT=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help)" ;;
  esac
done
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || die "--repeats must be a positive integer"
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
HERE=$(cd "$(dirname "$0")" && pwd)

if [[ -z $REPORT ]]; then
  BENCH=$BUILD/tools/chorus-bench TUNE=$BUILD/tools/chorus-tune
  [[ -x $BENCH && -x $TUNE ]] || die "$BENCH or $TUNE missing (ninja -C $BUILD chorus-bench chorus-tune chorus-run)"
  OUT=${OUT:-$(mktemp -d /tmp/cost_model_check.XXXXXX)}
  mkdir -p "$OUT"
  : >"$OUT/commands.txt"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)" | tee "$OUT/load.txt"
  if [[ -z $PROFILE ]]; then
    PROFILE=$OUT/profile.json
    if ((CORR)); then colls=allreduce; else colls=none; fi
    cmd=("$TUNE" --np "$NP" -o "$PROFILE" --collectives "$colls" --max-bytes "$MAX")
    echo "== ${cmd[*]}" | tee -a "$OUT/commands.txt"
    "${cmd[@]}" >"$OUT/tune.log" 2>&1 || die "chorus-tune failed: see $OUT/tune.log"
  fi
  cp "$PROFILE" "$OUT/profile.used.json" 2>/dev/null || true
  IFS=, read -r -a nps <<<"$NP"
  IFS=, read -r -a tps <<<"$TRANSPORTS"
  jobs=()
  for n in "${nps[@]}"; do for t in "${tps[@]}"; do jobs+=("$n:$t"); done; done
  for ((r = 1; r <= REPEATS; r++)); do
    for ((k = 0; k < ${#jobs[@]}; k++)); do
      job=${jobs[$(((k + r - 1) % ${#jobs[@]}))]}
      n=${job%%:*} t=${job#*:}
      f=$OUT/rep$r.np$n.$t.jsonl
      cmd=(env CHORUS_TRANSPORT="$t" CHORUS_TUNE_FILE="$PROFILE" "$BENCH" allreduce --np "$n" --algo all
        -b "$MIN" -e "$MAX" -f 4 --warmup-ms 20 --min-ms 20 --json "$f")
      echo "== repeat $r: ${cmd[*]}" | tee -a "$OUT/commands.txt"
      # --algo all exits 1 when some algorithm cannot run some size (noted in the log): not a failure.
      "${cmd[@]}" >"$OUT/rep$r.np$n.$t.log" 2>&1 || [[ -s $f ]] || die "chorus-bench failed: see $OUT/rep$r.np$n.$t.log"
    done
  done
  echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load.txt"
  REPORT=$OUT
fi

"$PY" - "$REPORT" <<'EOF'
import glob, json, math, os, re, sys, statistics
out = sys.argv[1]
cells = {}  # (np, transport, algo, bytes, inplace) -> {"meas": {rep: us}, "pred": us}
for path in sorted(glob.glob(os.path.join(out, "rep*.np*.*.jsonl"))):
    m = re.match(r"rep(\d+)\.np(\d+)\.(\w+)\.jsonl$", os.path.basename(path))
    rep, n, t = int(m.group(1)), int(m.group(2)), m.group(3)
    for line in open(path):
        j = json.loads(line)
        if j.get("predicted_us") is None or j.get("wrong", 0):
            continue
        key = (n, t, j["algo"], j["bytes"], j["inplace"])
        c = cells.setdefault(key, {"meas": {}, "pred": j["predicted_us"]})
        c["meas"][rep] = j["time_us"]
if not cells:
    sys.exit("cost_model_check: no rows with predictions in " + out)
if os.path.exists(os.path.join(out, "load.txt")):
    print(open(os.path.join(out, "load.txt")).read().rstrip())
groups = {}
for (n, t, a, b, ip), c in cells.items():
    groups.setdefault((n, t, a), []).append((b, ip, c))
print(f"\n{'ranks':>5} {'link':<4} {'algorithm':<20} {'sizes':>5} {'err':>7} {'noise':>7} {'signed':>7}  verdict   worst size (pred / measured)")
summary = {}
for (n, t, a) in sorted(groups):
    errs, signed, noise, worst = [], [], [], None
    for b, ip, c in sorted(groups[(n, t, a)]):
        reps = list(c["meas"].values())
        med = statistics.median(reps)
        lr = math.log(c["pred"] / med)
        errs.append(abs(lr)); signed.append(lr)
        if len(reps) > 1:
            noise += [abs(math.log(x / med)) for x in reps]
        if worst is None or abs(lr) > abs(worst[1]):
            worst = (b, lr, ip)
    e = math.exp(statistics.mean(errs)) - 1
    s = math.exp(statistics.mean(signed)) - 1
    nz = math.exp(statistics.mean(noise)) - 1 if noise else float("nan")
    verdict = "ok" if e <= 0.15 else ("noise" if noise and e <= nz else "MISS")
    summary.setdefault((n, t), []).append(e)
    wb, wl, wip = worst
    print(f"{n:>5} {t:<4} {a:<20} {len(errs):>5} {100*e:6.1f}% {100*nz:6.1f}% {100*s:+6.1f}%  {verdict:<8}  "
          f"{wb >> 10} KiB{' in place' if wip else ''}: {math.exp(wl):.2f}x")
print()
for (n, t), es in sorted(summary.items()):
    print(f"ranks {n} {t}: geometric-mean error over algorithms {100*(math.exp(statistics.mean(math.log1p(x) for x in es))-1):.1f}%")
EOF
