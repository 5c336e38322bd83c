#!/usr/bin/env bash
# The first hour, as a new user meets it: the README's two commands on a fresh
# clone with nothing set, timed, and the error cases of issue 27, each of which
# must be one line. Writes Markdown to standard output (bench/results/first-hour.md).
#
#   bash bench/first_hour.sh            # errors only (uses this checkout's build and .venv)
#   bash bench/first_hour.sh --clone    # also: clone into a new directory beside this one
#                                       # and run .ci/run there (make demo, make test,
#                                       # make test-slow), timed
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
py="$repo/.venv/bin/python"
[ -x "$py" ] || { echo "first_hour.sh: run make venv (or make demo) first" >&2; exit 2; }

echo "# The first hour ($(date -u +%Y-%m-%d), $(nproc) cores, commit $(git rev-parse --short HEAD))"
echo
if [ "${1:-}" = "--clone" ]; then
	dir="$(dirname "$repo")/memscale-first-hour-$$"
	git clone -q "$repo" "$dir"
	echo "## A fresh clone, nothing set"
	echo
	echo "\`git clone\` into a new directory beside this checkout (../shared beside it), then"
	echo "\`bash .ci/run\` there with an empty environment (\`env -i HOME PATH\`): it runs the README's"
	echo "\`make demo\` and \`make test\` as typed, then \`make test-slow\`, \`make fuzz\` and \`make soak SOAK_OPS=1000000\`."
	echo
	start=$SECONDS
	(cd "$dir" && env -i HOME="$HOME" PATH="$PATH" LANG=C.UTF-8 CI=true bash .ci/run >"$dir/ci.log" 2>&1)
	rc=$?
	echo "| command | wall time |"
	echo "|---|---|"
	sed -n 's/^== \(make .*\) took \([0-9]*\) s$/\2 \1/p' "$dir/ci.log" | while read -r secs command; do
		echo "| \`$command\` | $((secs / 60)) min $((secs % 60)) s |"
	done
	echo
	echo ".ci/run: exit status $rc after $(((SECONDS - start) / 60)) min; its log is $dir/ci.log. Its step lines"
	echo "and test summaries:"
	echo
	grep -E "^== |passed|failed|^(FAIL|ok  )" "$dir/ci.log" | grep -vE "^ok  " | sed 's/^/    /'
	echo
	echo "The demo's output:"
	echo
	sed -n '/^memscale demo:/,/^done in/p' "$dir/ci.log" | sed 's/^/    /'
	echo
fi

echo "## Errors: one line each"
echo
echo "Each command run from the repository root with no MEMSCALE_* variable but the one shown;"
echo "standard error as printed, then the exit status."
echo
run() {
	local shown="$1"
	shift
	echo "    \$ $shown"
	out=$(env -u MEMSCALE_LIBRARY PYTHONPATH="$repo/pytorch_plugin" "$@" 2>&1 >/dev/null)
	rc=$?
	printf '%s\n' "$out" | sed 's/^/    /'
	echo "    (exit status $rc)"
	echo
}
q=samples/quickstart.py
run "memscale run --threshold -5 $q" "$py" -m memscale run --threshold -5 $q
run "memscale run --threshold 200% $q" "$py" -m memscale run --threshold 200% $q
run "memscale run --threshold 0 $q" "$py" -m memscale run --threshold 0 $q
run "memscale run --threshold lots $q" "$py" -m memscale run --threshold lots $q
run "MEMSCALE_EVICTION_THRESHOLD=-5 memscale run $q" env MEMSCALE_EVICTION_THRESHOLD=-5 "$py" -m memscale run $q
run "MEMSCALE_EVICTION_THRESHOLD=200% memscale run $q" env MEMSCALE_EVICTION_THRESHOLD=200% "$py" -m memscale run $q
run "MEMSCALE_UNIT=layers memscale run $q" env MEMSCALE_UNIT=layers "$py" -m memscale run $q
run "memscale run --unit layers $q" "$py" -m memscale run --unit layers $q
run "memscale run missing.py" "$py" -m memscale run missing.py
run "memscale run" "$py" -m memscale run
run "memscale frobnicate" "$py" -m memscale frobnicate
echo "With \`--traceback\` (or MEMSCALE_DEBUG=1) the same error shows its traceback:"
echo
run "memscale --traceback run --threshold -5 $q" "$py" -m memscale --traceback run --threshold -5 $q

echo "## Answered at once"
echo
for cmd in "version" "--help"; do
	start=$(date +%s%N)
	PYTHONPATH="$repo/pytorch_plugin" "$py" -m memscale $cmd >/dev/null 2>&1
	end=$(date +%s%N)
	echo "- \`memscale $cmd\`: $(((end - start) / 1000000)) ms (python -m memscale: no torch imported)"
done
