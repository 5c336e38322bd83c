#!/usr/bin/env bash
# run_all.sh - every GPU check and benchmark of memscale, one command.
#
#   bash bench/gpu/run_all.sh [--pack] [OUT]        (OUT defaults to ./gpu-out)
#
# Needs: build/libmemscale.so (and build/abi_test, build/bench_driver if present),
# a python3 with torch (PYTHON=... to choose another). No Go. Each step is a
# separate process (a pluggable allocator can be installed once per process,
# before any CUDA allocation), its output tee'd into OUT/steps/NAME.log and its
# JSON written to OUT/steps/NAME.json. A failing step does not stop the others.
# At the end OUT/gpu-results.md (date, device, torch, commands, tables) and
# OUT/gpu-results.json are written and OUT/steps is archived into
# OUT/gpu-steps.tar.gz; --pack then removes OUT/steps, so that OUT holds 4 files
# (run_all.log, gpu-results.md, gpu-results.json, gpu-steps.tar.gz).
#
# Without a GPU every GPU step prints a skip message and the script still ends
# with the summary. Total time is capped by MEMSCALE_GPU_BUDGET_S (default 480 s):
# each step gets at most what is left. Exit status: 0 if no step failed.
#
# Order (issue 28's native region first where time is short): the checks,
# with the native region's torch extension built in the background meanwhile
# (native_ext, MAX_JOBS=8 under nice; families_cuda runs while it builds);
# then profile_step (native-region variants and their torch.profiler trace
# first) and gpt2_dtr (native region at seq 512 and 1024, its largest batch,
# then the Python region); the older measurements (families_cuda if not run
# yet, planner_check, fresh_warm, bench_replay) last, each skipped when fewer
# seconds are left than it needs.
#
# Environment: PYTHON (default python3), MEMSCALE_LIBRARY (default
# build/libmemscale.so), MEMSCALE_GPU_BUDGET_S, MEMSCALE_GPU_WORK (scratch
# directory for large files; default a fresh mktemp directory, removed at the end),
# MEMSCALE_GPU_SKIP (step names to skip, space-separated: a short rerun of the
# steps a fix touched, e.g. "gpt2_dtr bench_replay").

set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd) || exit 2
COMMAND_LINE="bash bench/gpu/run_all.sh $*"
for v in MEMSCALE_GPU_BUDGET_S MEMSCALE_GPU_SKIP PYTHON MEMSCALE_LIBRARY PYTHONPATH; do
	[ -n "${!v:-}" ] && COMMAND_LINE="$v=${!v} $COMMAND_LINE"
done
PACK=0
if [ "${1:-}" = "--pack" ]; then
	PACK=1
	shift
fi
# OUT and MEMSCALE_LIBRARY may be relative to the caller's directory: resolve them first.
OUT=${1:-./gpu-out}
mkdir -p "$OUT/steps" || exit 2
OUT=$(cd "$OUT" && pwd) || exit 2
STEPS=$OUT/steps
rm -f "$STEPS"/*.json "$STEPS"/*.log "$STEPS/steps.tsv"
MEMSCALE_LIBRARY=${MEMSCALE_LIBRARY:-$ROOT/build/libmemscale.so}
case $MEMSCALE_LIBRARY in /*) ;; *) MEMSCALE_LIBRARY=$PWD/$MEMSCALE_LIBRARY ;; esac
export MEMSCALE_LIBRARY
cd "$ROOT" || exit 2

PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT/pytorch_plugin${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
BUDGET=${MEMSCALE_GPU_BUDGET_S:-480}
RESERVE=15 # seconds kept for the summary
START=$(date +%s)
MADE_WORK=0
if [ -n "${MEMSCALE_GPU_WORK:-}" ]; then
	WORK=$MEMSCALE_GPU_WORK
	mkdir -p "$WORK"
else
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/memscale-gpu.XXXXXX") || exit 2
	MADE_WORK=1
fi
HAVE_TIMEOUT=0
command -v timeout >/dev/null 2>&1 && HAVE_TIMEOUT=1
FAILED=0

left() { echo $((BUDGET - ($(date +%s) - START) - RESERVE)); }

# record NAME STATUS RC SECONDS COMMAND...
record() {
	local name=$1 status=$2 rc=$3 secs=$4
	shift 4
	printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$secs" "$*" >>"$STEPS/steps.tsv"
}

# skip_step NAME REASON COMMAND...
skip_step() {
	local name=$1 reason=$2
	shift 2
	echo "== $name: SKIPPED ($reason)" | tee "$STEPS/$name.log"
	record "$name" "skipped: $reason" - 0 "$@"
}

# bg_start NAME MAX_SECONDS COMMAND... : start a step in the background (its
# output into steps/NAME.log); bg_wait NAME prints that log and records it.
BG_PID="" BG_T0=0 BG_CMD="" BG_MAX=0
bg_start() {
	local name=$1 max=$2
	shift 2
	case " ${MEMSCALE_GPU_SKIP:-} " in
	*" $name "*)
		skip_step "$name" "in MEMSCALE_GPU_SKIP" "$@"
		return 0
		;;
	esac
	BG_T0=$(date +%s) BG_CMD="$*" BG_MAX=$max
	rm -f "$WORK/$name.rc"
	echo
	echo "== $name (background, limit ${max}s): $*"
	if [ "$HAVE_TIMEOUT" = 1 ]; then
		(
			timeout --kill-after=15 "$max" "$@" >"$STEPS/$name.log" 2>&1
			echo $? >"$WORK/$name.rc"
		) &
	else
		(
			"$@" >"$STEPS/$name.log" 2>&1
			echo $? >"$WORK/$name.rc"
		) &
	fi
	BG_PID=$!
}
bg_wait() {
	local name=$1 rc status
	[ -n "$BG_PID" ] || return 0
	echo
	echo "== $name: waiting for the background step ($(($(date +%s) - BG_T0))s so far)"
	wait "$BG_PID"
	BG_PID=""
	rc=$(cat "$WORK/$name.rc" 2>/dev/null || echo 1)
	sed 's/^/    /' "$STEPS/$name.log" | tail -40
	step_status "$rc" "$BG_MAX"
	echo "== $name: $status (exit $rc, $(($(date +%s) - BG_T0))s, in the background)"
	record "$name" "$status" "$rc" "$(($(date +%s) - BG_T0))" "$BG_CMD"
}

# step_status RC LIMIT: sets status (ok, "timeout after LIMITs" for 124/137,
# failed) from a step's exit code; FAILED=1 unless ok.
step_status() {
	status=ok
	if [ "$1" = 124 ] || [ "$1" = 137 ]; then
		status="timeout after ${2}s"
		FAILED=1
	elif [ "$1" != 0 ]; then
		status=failed
		FAILED=1
	fi
}

bg_running() { [ -n "$BG_PID" ] && kill -0 "$BG_PID" 2>/dev/null; }

# step NAME MAX_SECONDS COMMAND... : run with a time limit, tee into steps/NAME.log;
# skipped when fewer than NEED seconds (default 10) are left.
step() {
	local name=$1 max=$2
	shift 2
	local t
	case " ${MEMSCALE_GPU_SKIP:-} " in
	*" $name "*)
		skip_step "$name" "in MEMSCALE_GPU_SKIP" "$@"
		return 0
		;;
	esac
	t=$(left)
	[ "$t" -gt "$max" ] && t=$max
	if [ "$t" -lt "${NEED:-10}" ]; then
		skip_step "$name" "time budget of ${BUDGET}s used up (${t}s left, ${NEED:-10}s needed)" "$@"
		return 0
	fi
	echo
	echo "== $name (limit ${t}s): $*"
	local t0 rc status
	t0=$(date +%s)
	if [ "$HAVE_TIMEOUT" = 1 ]; then
		timeout --kill-after=15 "$t" "$@" 2>&1 | tee "$STEPS/$name.log"
	else
		"$@" 2>&1 | tee "$STEPS/$name.log"
	fi
	rc=${PIPESTATUS[0]}
	step_status "$rc" "$t"
	echo "== $name: $status (exit $rc, $(($(date +%s) - t0))s)"
	record "$name" "$status" "$rc" "$(($(date +%s) - t0))" "$@"
}

main() {
	echo "memscale GPU run: $(date -Is 2>/dev/null || date), OUT=$OUT, budget ${BUDGET}s, python $PY, library $MEMSCALE_LIBRARY"
	# The carried binaries need glibc 2.34 or later (bench/gpu/README.md): say first what is here.
	local glibc
	glibc=$(ldd --version 2>&1 | head -1)
	echo "== glibc: $glibc"
	case $(echo "$glibc" | awk '{print $NF}') in
	2.[0-9] | 2.[12][0-9] | 2.3[0-3]) echo "WARNING: glibc older than 2.34: the carried libmemscale.so and C drivers will not load (rebuild them on an older glibc)" ;;
	esac

	if command -v nvidia-smi >/dev/null 2>&1; then
		step nvidia_smi 30 nvidia-smi
	else
		skip_step nvidia_smi "nvidia-smi not found" nvidia-smi
	fi
	step env 60 "$PY" bench/gpu/env_info.py --out "$STEPS/env.json"
	HAVE_CUDA=$("$PY" -c 'import json,sys; print(1 if json.load(open(sys.argv[1])).get("cuda_available") else 0)' "$STEPS/env.json" 2>/dev/null || echo 0)
	[ "$HAVE_CUDA" = 1 ] || echo "NOTE: torch sees no CUDA device here: the GPU steps will skip themselves"
	if [ ! -f "$MEMSCALE_LIBRARY" ]; then
		echo "WARNING: $MEMSCALE_LIBRARY does not exist (run make here and carry build/): memscale steps will fail"
	fi

	# The native region's torch extension (issue 28) is built against this
	# machine's torch, in the background while the checks below run (a
	# compiler and ninja are needed); every later process loads it from the
	# cache. Half the cores and a lower priority: the checks keep the rest.
	if [ "$HAVE_CUDA" = 1 ]; then
		bg_start native_ext 300 nice -n 10 env MAX_JOBS=${MEMSCALE_BUILD_JOBS:-8} \
			"$PY" bench/gpu/native_ext.py --out "$STEPS/native_ext.json"
	else
		step native_ext 60 "$PY" bench/gpu/native_ext.py --out "$STEPS/native_ext.json"
	fi

	# 0. Smoke: memscale as PyTorch's allocator, one PASS/FAIL line per check.
	step smoke 120 "$PY" bench/gpu/smoke.py --out "$STEPS/smoke.json"
	# What a mapping costs by its size (issue 29 item 2: one handle per large request?).
	step map_cost 60 "$PY" bench/gpu/map_cost.py --out "$STEPS/map_cost.json"

	# 1. C ABI on the device.
	# Device mode: streams made with cuStreamCreate, host-side data checks skipped.
	# MEMSCALE_GPU_FAKECUDA=DIR (selftest.sh) runs it on the fake libcuda.so.1 in DIR.
	if [ ! -x build/abi_test ]; then
		skip_step abi_test "build/abi_test not built (make test-c)" build/abi_test
	elif [ -n "${MEMSCALE_GPU_FAKECUDA:-}" ]; then
		step abi_test 90 env LD_LIBRARY_PATH="$MEMSCALE_GPU_FAKECUDA" FAKECUDA_DEVICES=1 FAKECUDA_MEMORY=4294967296 \
			MEMSCALE_BACKEND=cuda build/abi_test "$MEMSCALE_LIBRARY"
	elif [ "$HAVE_CUDA" != 1 ]; then
		skip_step abi_test "no CUDA device" env MEMSCALE_BACKEND=cuda build/abi_test "$MEMSCALE_LIBRARY"
	else
		step abi_test 90 env MEMSCALE_BACKEND=cuda build/abi_test "$MEMSCALE_LIBRARY"
	fi
	if [ ! -x build/bench_driver ]; then
		skip_step bench_driver "build/bench_driver not built (make bench-c)" build/bench_driver
	elif [ "$HAVE_CUDA" != 1 ]; then
		skip_step bench_driver "no CUDA device" env MEMSCALE_BACKEND=cuda build/bench_driver "$MEMSCALE_LIBRARY"
	else
		step bench_driver 90 env MEMSCALE_BACKEND=cuda build/bench_driver "$MEMSCALE_LIBRARY"
	fi
	step alloc_latency 90 "$PY" bench/gpu/alloc_latency.py --out "$STEPS/alloc_latency.json"

	# 2. Correctness: native vs memscale vs memscale + DTR, then the comparison.
	step correctness_native 150 "$PY" bench/gpu/correctness.py --allocator native \
		--save "$WORK/correctness_native.pt" --out "$STEPS/correctness_native.json"
	step correctness_memscale 150 "$PY" bench/gpu/correctness.py --allocator memscale \
		--save "$WORK/correctness_memscale.pt" --out "$STEPS/correctness_memscale.json"
	step correctness_memscale_dtr 180 "$PY" bench/gpu/correctness.py --allocator memscale \
		--dtr-fraction 0.6 --native-json "$STEPS/correctness_native.json" \
		--save "$WORK/correctness_memscale_dtr.pt" --out "$STEPS/correctness_memscale_dtr.json"
	if [ -f "$WORK/correctness_native.pt" ]; then
		step correctness_compare 90 "$PY" bench/gpu/correctness.py --compare "$WORK/correctness_native.pt" \
			"$WORK/correctness_memscale.pt" "$WORK/correctness_memscale_dtr.pt" --out "$STEPS/correctness_compare.json"
	else
		skip_step correctness_compare "no native run saved (GPU steps skipped or failed)" \
			"$PY" bench/gpu/correctness.py --compare ...
	fi
	# While the extension is still building, an older check that needs no extension.
	local families_done=0
	if bg_running; then
		step families_cuda 90 "$PY" bench/families_check.py --device cuda --json "$STEPS/families_cuda.json" \
			--families bert deberta_v2 mistral gemma gpt_neox mamba big_bird whisper wav2vec2 clip swin mobilenet_v2
		families_done=1
	fi
	bg_wait native_ext

	# 3. Issue 28's native region first. Where a GPT-2 step under a region
	#    spends its time (one process; native-region variants and one
	#    torch.profiler trace first, then the older Python-region ones while
	#    its 45 s last), then GPT-2 at seq 512 and 1024: plain, native region
	#    at 50 % of plain's peak and at the card's size, its largest batch,
	#    then the same on the Python region (all the time left but 30 s).
	step profile_step 120 "$PY" bench/gpu/profile_step.py --seq 1024 --out "$STEPS" \
		--native-ext-json "$STEPS/native_ext.json" --time-budget 45
	local t
	t=$(($(left) - 30))
	step gpt2_dtr "$t" "$PY" bench/gpu/gpt2_dtr.py --out-dir "$STEPS" --work "$WORK" --seqs 512,1024 \
		--regions native,python --native-ext-json "$STEPS/native_ext.json" --time-budget $((t > 40 ? t - 20 : 20))

	# The older measurements (their numbers are in bench/results/gpu-2026-11-27-*.md), when time is left.
	# memscale.check (plain step vs the stress setting, every rebuild verified)
	# on a dozen Hugging Face families on the device (tests/families.py).
	if [ "$families_done" = 0 ]; then
		NEED=40 step families_cuda 90 "$PY" bench/families_check.py --device cuda --json "$STEPS/families_cuda.json" \
			--families bert deberta_v2 mistral gemma gpt_neox mamba big_bird whisper wav2vec2 clip swin mobilenet_v2
	fi

	# memscale plan's predictions against this GPU (issue 31): GPT-2 planned on meta
	# with this device's cost model, then measured under PyTorch's allocator.
	NEED=120 step planner_check 150 "$PY" bench/gpu/planner_check.py --out "$STEPS" --time-budget 110

	# The same DTR step in a fresh process, in a warm one (plain steps first) and
	# with step boundaries (issue 29: allocator step plans), budget from (a)'s peak.
	NEED=140 step fresh_warm 150 "$PY" bench/gpu/fresh_warm.py --out-dir "$STEPS" --native-json "$STEPS/gpt2_native.json" \
		--time-budget 135

	# 4. Snapshots replayed under real allocators, and the native model against memory_stats.
	t=$(left)
	NEED=60 step bench_replay "$t" "$PY" bench/gpu/bench_replay.py --out "$STEPS" --work "$WORK/bench_replay" \
		--time-budget $((t > 40 ? t - 20 : 20))

	echo
	echo "== summary"
	tar czf "$OUT/gpu-steps.tar.gz" -C "$OUT" steps 2>/dev/null || echo "WARNING: could not archive $STEPS"
	if ! "$PY" bench/gpu/summarize.py --out "$OUT" --steps "$STEPS" --command "$COMMAND_LINE"; then
		{
			echo "# memscale GPU results (summarize.py failed; raw step table)"
			echo
			echo "- Date: $(date -Is 2>/dev/null || date)"
			echo "- Command: $COMMAND_LINE"
			echo
			sed 's/\t/ | /g; s/^/| /; s/$/ |/' "$STEPS/steps.tsv"
		} >"$OUT/gpu-results.md"
		cat "$OUT/gpu-results.md"
	fi
	if [ "$PACK" = 1 ] && tar tzf "$OUT/gpu-steps.tar.gz" >/dev/null 2>&1; then
		rm -rf "$STEPS"
	fi
	[ "$MADE_WORK" = 1 ] && rm -rf "$WORK"
	echo "== done in $(($(date +%s) - START))s; results in $OUT (gpu-results.md)"
	[ "$FAILED" = 0 ] && echo "all steps passed or were skipped" || echo "SOME STEPS FAILED (see the Steps table)"
	return "$FAILED"
}

main 2>&1 | tee "$OUT/run_all.log"
exit "${PIPESTATUS[0]}"
