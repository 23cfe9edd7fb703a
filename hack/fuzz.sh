#!/usr/bin/env bash
# fuzz.sh runs every fuzz target of the module (every `func FuzzX` in a
# _test.go file) for FUZZTIME each, one after another, and fails on the
# first crash (go test keeps the crashing input under the package's
# testdata/fuzz/FuzzX/ for a regression seed).
#
#   hack/fuzz.sh                  # FUZZTIME=10m each (make fuzz)
#   FUZZTIME=5s FUZZMINIMIZETIME=1s hack/fuzz.sh   # the short run of `make test` (make fuzz-short)
#   hack/fuzz.sh FuzzOpen         # only targets matching the pattern
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
FUZZTIME="${FUZZTIME:-10m}"
# Minimizing a new input runs on the fuzz time: Go's default (60 s) can
# take a short run whole.
FUZZMINIMIZETIME="${FUZZMINIMIZETIME:-5s}"
pattern="${1:-.}"
mapfile -t targets < <(git grep -n -E '^func Fuzz[A-Za-z0-9_]+\(' -- '*_test.go' |
	sed -E 's|^(.*)/[^/]+_test\.go:[0-9]+:func (Fuzz[A-Za-z0-9_]+)\(.*|\1 \2|' | grep -E " .*${pattern}" | sort)
echo "fuzz: ${#targets[@]} targets, ${FUZZTIME} each"
for t in "${targets[@]}"; do
	dir=${t% *} name=${t#* }
	echo "--- fuzz ./$dir $name ($FUZZTIME)"
	corpus="$dir/testdata/fuzz/$name"
	before=$(ls "$corpus" 2>/dev/null | sort || true)
	out=$(mktemp)
	# -parallel 2: the machines that run this have 2 cores.
	if go test "./$dir" -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" -parallel 2 2>&1 | tee "$out"; then
		rm -f "$out"
		continue
	fi
	after=$(ls "$corpus" 2>/dev/null | sort || true)
	# Go 1.26's fuzz coordinator can fail a run whose -fuzztime ends while a
	# worker is mid-input: "context deadline exceeded", with no input
	# written (go.dev/issue/75804, fixed in Go 1.27). Only a written
	# input is a crash.
	if [[ "$before" == "$after" ]] && grep -q '^    context deadline exceeded$' "$out"; then
		echo "fuzz: $name: the run ended on Go's fuzztime race (go.dev/issue/75804), no failing input: not a crash"
		rm -f "$out"
		continue
	fi
	rm -f "$out"
	echo "fuzz: $name failed; its input is under $corpus (a regression seed once the defect is fixed)"
	exit 1
done
