#!/usr/bin/env bash
# Generates dataplane.capnp.go from dataplane.capnp (run by make generate).
# Debian's capnp lacks the standard schemas; they come from the Go module.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
std="$(go list -m -f '{{.Dir}}' capnproto.org/go/capnp/v3)/std"
capnp compile -I "$std" -ogo dataplane.capnp
