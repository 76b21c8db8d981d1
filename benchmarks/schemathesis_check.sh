#!/usr/bin/env bash
# Fuzz the gateway from its own OpenAPI description (gateway/openapi.json) with
# schemathesis: every generated request must get an answer that is not a server
# error and that conforms to the spec (status codes, the Error schema).
# Loopback only: the gateway runs with two EMULATED backends (serve --emulate).
# schemathesis lives in a throwaway venv, not the project's.
#
#   bash benchmarks/schemathesis_check.sh [MAX_EXAMPLES]      (default 40 per operation)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv="${TMPDIR:-/tmp}/specroute-schemathesis"
[[ -x "$venv/bin/st" ]] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q schemathesis; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
.venv/bin/specroute serve --emulate --port "$port" >/dev/null 2>&1 &
gateway=$!
trap 'kill "$gateway" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.1
done
"$venv/bin/st" run gateway/openapi.json --url "http://127.0.0.1:$port" \
    --checks not_a_server_error,response_schema_conformance,status_code_conformance \
    --max-examples "${1:-40}"
