#!/usr/bin/env bash
# selftest.sh - check the bench/gpu scripts on a machine WITHOUT a GPU (about 1-2 minutes).
#
#   PYTHON=.venv/bin/python bash bench/gpu/selftest.sh
#
# Syntax, --dry-run of every script, the skip path (exit 0 with a SKIP message),
# the CPU test modes (correctness + DTR + compare, GPT-2 driver with a tiny model,
# the ctypes latency benchmark on the simulated device) and run_all.sh itself.
# Needs build/libmemscale.so (make). Exit status 0 if every check passed.

set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd) || exit 2
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT/pytorch_plugin${PYTHONPATH:+:$PYTHONPATH}"
export MEMSCALE_LIBRARY=${MEMSCALE_LIBRARY:-$ROOT/build/libmemscale.so}
T=$(mktemp -d "${TMPDIR:-/tmp}/memscale-gpu-selftest.XXXXXX") || exit 2
FAIL=0
G=bench/gpu

check() { # check NAME COMMAND... : must exit 0
	local name=$1
	shift
	if "$@" >"$T/$name.log" 2>&1; then
		echo "ok   $name"
	else
		echo "FAIL $name (exit $?): $*"
		tail -20 "$T/$name.log"
		FAIL=1
	fi
}
expect() { # expect NAME PATTERN FILE : FILE contains PATTERN
	if grep -q -- "$2" "$3" 2>/dev/null; then
		echo "ok   $1"
	else
		echo "FAIL $1: '$2' not in $3"
		FAIL=1
	fi
}

check bash-syntax bash -n $G/run_all.sh
check py-compile "$PY" -m py_compile $G/_common.py $G/alloc_latency.py $G/correctness.py $G/gpt2_dtr.py $G/env_info.py $G/summarize.py $G/smoke.py $G/profile_step.py $G/bench_replay.py $G/planner_check.py $G/fresh_warm.py $G/native_ext.py
check dry-smoke "$PY" $G/smoke.py --dry-run
check dry-alloc "$PY" $G/alloc_latency.py --dry-run
check dry-correctness-native "$PY" $G/correctness.py --allocator native --save "$T/x.pt" --dry-run
check dry-correctness-memscale "$PY" $G/correctness.py --allocator memscale --save "$T/x.pt" --dry-run
check dry-correctness-compare "$PY" $G/correctness.py --compare a.pt b.pt --dry-run
check dry-gpt2 "$PY" $G/gpt2_dtr.py --dry-run
check dry-gpt2-seqs "$PY" $G/gpt2_dtr.py --dry-run --seqs 512,1024 --regions native,python
check dry-native-ext "$PY" $G/native_ext.py --dry-run
check dry-env "$PY" $G/env_info.py --dry-run
check dry-planner "$PY" $G/planner_check.py --dry-run
check dry-fresh-warm "$PY" $G/fresh_warm.py --dry-run
check dry-map-cost "$PY" $G/map_cost.py --dry-run

if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	echo "note: this machine has a GPU; skipping the no-GPU skip checks"
else
	check skip-alloc "$PY" $G/alloc_latency.py --out "$T/al.json"
	check skip-correctness "$PY" $G/correctness.py --allocator memscale --save "$T/m.pt" --out "$T/cm.json"
	check skip-gpt2 "$PY" $G/gpt2_dtr.py --out-dir "$T/g0"
	check skip-smoke "$PY" $G/smoke.py --out "$T/s0.json"
	check skip-map-cost "$PY" $G/map_cost.py --out "$T/mc.json"
	expect skip-map-cost-json '"skipped"' "$T/mc.json"
	expect skip-smoke-json '"skipped"' "$T/s0.json"
	expect skip-correctness-json '"skipped"' "$T/cm.json"
	expect skip-gpt2-json '"skipped"' "$T/g0/gpt2_dtr.json"
	check skip-native-ext "$PY" $G/native_ext.py --out "$T/ne0.json"
	expect skip-native-ext-json '"skipped"' "$T/ne0.json"
	check skip-fresh-warm "$PY" $G/fresh_warm.py --out-dir "$T/fw0"
	expect skip-fresh-warm-json '"skipped"' "$T/fw0/fresh_warm.json"
	check skip-planner "$PY" $G/planner_check.py --out "$T/pc0"
	expect skip-planner-json '"skipped"' "$T/pc0/planner_check.json"
	check skip-families "$PY" bench/families_check.py --device cuda --families bert --json "$T/f0.json"
	expect skip-families-json '"skipped"' "$T/f0.json"
fi
check cpu-families "$PY" bench/families_check.py --families bert vit --json "$T/f1.json"
expect cpu-families-safe '"status": "ok"' "$T/f1.json"

# CPU test modes: the real code paths, tiny sizes.
check cpu-alloc-sim "$PY" $G/alloc_latency.py --backend sim --no-cuda-baseline --row-seconds 0.2 --out "$T/sim.json"
expect cpu-alloc-sim-rows '"median_ns"' "$T/sim.json"
check cpu-correctness-native "$PY" $G/correctness.py --allocator native --device cpu --batch 4096 --save "$T/n.pt" --out "$T/n.json"
check cpu-correctness-dtr "$PY" $G/correctness.py --allocator native --device cpu --batch 4096 --dtr-budget 110000000 --save "$T/d.pt" --out "$T/d.json"
expect cpu-correctness-dtr-evicts '"evictions": [1-9]' "$T/d.json"
check cpu-correctness-compare "$PY" $G/correctness.py --compare "$T/n.pt" "$T/d.pt" --out "$T/cmp.json"
expect cpu-correctness-bitwise '"bitwise_equal": true' "$T/cmp.json"
# The native region's extension (issue 28): built or loaded here, one op on the native path.
check cpu-native-ext "$PY" $G/native_ext.py --device cpu --out "$T/ne1.json"
expect cpu-native-ext-ok '"native_path": true' "$T/ne1.json"
# Plain, the native and the Python region (each at 50 % and at the card's size), then the largest batches.
check cpu-gpt2-driver "$PY" $G/gpt2_dtr.py --device cpu --layers 2 --width 64 --heads 4 --seq 64 --vocab 512 --batch 4 \
	--steps 2 --warmup 1 --dropout 0.1 --out-dir "$T/g1" --work "$T/g1w" --time-budget 300 --max-batch 8 --max-probes 2 \
	--cpu-fit-budget 6000000 --regions native,python --reserve-after-fit 60
expect cpu-gpt2-grads '"grads_bitwise_equal": true' "$T/g1/gpt2_dtr.json"
expect cpu-gpt2-budget '"dtr_peak_within_budget_plus_one_op": true' "$T/g1/gpt2_dtr.json"
expect cpu-gpt2-native-region '"region_path_used": "native"' "$T/g1/gpt2_native-region-50_s64.json"
expect cpu-gpt2-native-region-grads '"grads_bitwise_equal": true' "$T/g1/gpt2_native-region-card_s64.json"
expect cpu-gpt2-cpu-time '"median_thread_cpu_s": [0-9]' "$T/g1/gpt2_native-region-50_s64.json"
expect cpu-gpt2-native-region-fit '"fit_native_region_stopped"' "$T/g1/gpt2_dtr.json"
# Two lengths, the native region only (at 70 %: 50 % is below what the tiny model's shorter step needs).
check cpu-gpt2-mini "$PY" $G/gpt2_dtr.py --device cpu --impl mini --layers 2 --width 64 --heads 4 --seqs 64,32 --vocab 512 \
	--batch 4 --steps 2 --warmup 1 --out-dir "$T/g2" --work "$T/g2w" --time-budget 200 --skip-fit --regions native --fraction 0.7
expect cpu-gpt2-mini-grads '"grads_bitwise_equal": true' "$T/g2/gpt2_native-region-70_s32.json"
expect cpu-gpt2-mini-seq32 '"status": "ok"' "$T/g2/gpt2_native-region-card_s32.json"
check cpu-fresh-warm "$PY" $G/fresh_warm.py --device cpu --impl mini --layers 2 --width 64 --heads 4 --seq 64 --vocab 512 \
	--batch 4 --steps 1 --warmup 0 --warm-steps 1 --native-json "$T/g2/gpt2_native.json" --out-dir "$T/fw1" --time-budget 120
expect cpu-fresh-warm-ratio '"fresh_over_warm"' "$T/fw1/fresh_warm.json"

check cpu-planner "$PY" $G/planner_check.py --device cpu --configs 2x32,4x32 --warmup 1 --steps 1 --top 3 --out "$T/pc1"
expect cpu-planner-predicted '"step_ns"' "$T/pc1/planner_check.json"
expect cpu-planner-measured-plan '"min_budget_bytes"' "$T/pc1/planner_check.json"
expect cpu-planner-table "| 4 x 32 |" "$T/cpu-planner.log"
check cpu-profile-step "$PY" $G/profile_step.py --device cpu --steps 1 --top 5 --out "$T/ps"
expect cpu-profile-step-variants '"budget-host-timer"' "$T/ps/profile_step.json"
expect cpu-profile-step-syncs '"synchronizations_per_step"' "$T/ps/profile_step.json"
expect cpu-profile-step-wrap-card '"wrap-card"' "$T/ps/profile_step.json"
expect cpu-profile-step-blocks '"blocks-min"' "$T/ps/profile_step.json"
expect cpu-profile-step-native '"budget-native": "ok"' "$T/ps/profile_step.json"
expect cpu-profile-step-cpu '"cpu_per_step"' "$T/ps/profile_step.json"
if [ -s "$T/ps/profile_step_trace_budget-native.json.gz" ]; then echo "ok   cpu-profile-step-trace"; else
	echo "FAIL cpu-profile-step-trace: no $T/ps/profile_step_trace_budget-native.json.gz"
	FAIL=1
fi
check cpu-smoke "$PY" $G/smoke.py --device cpu --out "$T/s1.json"
expect cpu-smoke-recompute '"name": "dtr_recompute",' "$T/s1.json"
expect cpu-smoke-park '"name": "dtr_park",' "$T/s1.json"
expect cpu-smoke-blocks '"name": "blocks_dtr",' "$T/s1.json"
expect cpu-smoke-passed '"passed": 7,' "$T/s1.json"

# run_all.sh end to end (on a machine without a GPU every GPU step skips itself;
# abi_test runs in device mode on the fake libcuda.so.1 of device/cuda's tests).
FAKE="$T/fakecuda"
mkdir -p "$FAKE"
check build-fakecuda ${CC:-cc} -O2 -shared -fPIC -o "$FAKE/libcuda.so.1" device/cuda/testdata/fakecuda/fakecuda.c -lpthread
check run-all env PYTHON="$PY" MEMSCALE_GPU_FAKECUDA="$FAKE" bash $G/run_all.sh --pack "$T/out"
expect run-all-md "## Steps" "$T/out/gpu-results.md"
expect run-all-glibc "== glibc: " "$T/out/run_all.log"
expect run-all-abi-device-mode "device mode: streams made with cuStreamCreate" "$T/out/run_all.log"
expect run-all-abi-passed "| abi_test | ok |" "$T/out/gpu-results.md"
expect run-all-native-section "## 3a. The native region" "$T/out/gpu-results.md"
expect run-all-native-ext "| native_ext | skipped" "$T/out/gpu-results.md"
n=$(find "$T/out" -type f | wc -l)
if [ "$n" -le 6 ]; then echo "ok   run-all-files ($n files in OUT; at most 6 may come back)"; else
	echo "FAIL run-all-files: $n files in OUT"
	FAIL=1
fi

rm -rf "$T"
[ "$FAIL" = 0 ] && echo "selftest: all passed" || echo "selftest: FAILED"
exit "$FAIL"
