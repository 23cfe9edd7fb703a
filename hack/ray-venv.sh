#!/usr/bin/env bash
# ray-venv.sh installs Ray (from PyPI) into its own virtualenv under the
# dependency cache, for bench/sort's peer (docs/benchmarks.md, "Sort"). Only
# the sort benchmark needs it, so hack/install-deps.sh does not run it and CI
# does not install Ray. Idempotent; prints the venv's python on the last line.
#
#   hack/ray-venv.sh            install (or check) and print the python path
set -euo pipefail

CACHE="${ZIPTRAIL_CACHE:-$HOME/.cache/ziptrail}"
RAY_VERSION="${RAY_VERSION:-2.60.0}"
VENV="$CACHE/ray-$RAY_VERSION"
PY="${PYTHON:-python3}"

if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import ray, sys; sys.exit(ray.__version__ != '$RAY_VERSION')" 2>/dev/null; then
	echo "$VENV/bin/python"
	exit 0
fi
echo "[ray-venv] installing ray==$RAY_VERSION into $VENV" >&2
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >&2
"$VENV/bin/pip" install -q "ray==$RAY_VERSION" >&2
"$VENV/bin/python" -c "import ray; print('[ray-venv] ray', ray.__version__)" >&2
echo "$VENV/bin/python"
