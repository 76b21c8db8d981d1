#!/usr/bin/env bash
# Regenerate the vendored Python classes (and their type stubs) from
# ext_proc_subset.proto. Run by hand after editing the .proto; needs the dev
# extra (grpcio-tools, mypy-protobuf). Nothing runs this at install or run time.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
cd "$root"
"$py" -m grpc_tools.protoc -I . --python_out=. --mypy_out=. \
    --plugin=protoc-gen-mypy="$(dirname "$py")/protoc-gen-mypy" \
    gateway/extproc/pb/ext_proc_subset.proto
