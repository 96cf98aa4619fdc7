#!/usr/bin/env bash
# Regenerate the kubelet DRA plugin and plugin registration stubs (dra_pb2*.py, pluginregistration_pb2*.py)
# from the .proto files in src/gpuslice/k8s/dra/proto/ with grpcio-tools.
#
#   scripts/gen_dra_stubs.sh            # rewrite the committed stubs in src/gpuslice/k8s/dra/proto/
#   scripts/gen_dra_stubs.sh OUT_DIR    # write them into OUT_DIR instead (the test compares)
#
# Compiled with src/ as the include root, so the gRPC modules import their messages as
# gpuslice.k8s.dra.proto.<name>_pb2. PYTHON picks the interpreter (default: .venv/bin/python if present,
# else python3); it needs grpcio-tools (pip install 'gpuslice[test]').
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
out="${1:-$root/src/gpuslice/k8s/dra/proto}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cd "$root/src"
for name in dra pluginregistration; do
  "$PYTHON" -m grpc_tools.protoc -I . --python_out="$work" --grpc_python_out="$work" \
    "gpuslice/k8s/dra/proto/$name.proto"
  cp "$work/gpuslice/k8s/dra/proto/${name}_pb2.py" "$work/gpuslice/k8s/dra/proto/${name}_pb2_grpc.py" "$out/"
done
echo "wrote the DRA and plugin registration stubs to $out"
