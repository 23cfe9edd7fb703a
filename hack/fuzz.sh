#!/usr/bin/env bash
# fuzz.sh runs every fuzz target of the module (every `func FuzzX` in a
# _test.go file) for FUZZTIME each, one after another, and fails on the
# first crash (go test keeps the crashing input under the package's
# testdata/fuzz/FuzzX/ for a regression seed).
#
#   hack/fuzz.sh                  # FUZZTIME=10m each (make fuzz)
#   FUZZTIME=5s hack/fuzz.sh      # the short run of `make test`
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
	# -parallel 2: the machines that run this have 2 cores.
	go test "./$dir" -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" -parallel 2
done
