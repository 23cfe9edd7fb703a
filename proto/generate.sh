#!/usr/bin/env bash
# Generates the Go stubs of the sidecar's local API (run by make generate,
# which puts the pinned protoc-gen-go and protoc-gen-go-grpc on PATH).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
protoc -I proto --go_out=. --go_opt=module=github.com/ziptrail/ziptrail \
	--go-grpc_out=. --go-grpc_opt=module=github.com/ziptrail/ziptrail \
	proto/ziptrail/sidecar/v1/sidecar.proto
