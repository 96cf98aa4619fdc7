#!/usr/bin/env bash
# Regenerate the kubelet device plugin stubs (deviceplugin_pb2.py, deviceplugin_pb2_grpc.py) from
# src/gpuslice/k8s/proto/deviceplugin.proto with grpcio-tools.
#
#   scripts/gen_deviceplugin_stubs.sh            # rewrite the committed stubs in src/gpuslice/k8s/proto/
#   scripts/gen_deviceplugin_stubs.sh OUT_DIR    # write them into OUT_DIR instead (the test compares)
#
# The proto is compiled with src/ as the include root, so the gRPC module imports its messages as
# gpuslice.k8s.proto.deviceplugin_pb2 (a bare "import deviceplugin_pb2" would only work from that dir).
# PYTHON picks the interpreter (default: .venv/bin/python if present, else python3); it needs
# grpcio-tools (pip install 'gpuslice[test]').
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
out="${1:-$root/src/gpuslice/k8s/proto}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cd "$root/src"
"$PYTHON" -m grpc_tools.protoc \
  -I . \
  --python_out="$work" \
  --grpc_python_out="$work" \
  gpuslice/k8s/proto/deviceplugin.proto

cp "$work/gpuslice/k8s/proto/deviceplugin_pb2.py" "$work/gpuslice/k8s/proto/deviceplugin_pb2_grpc.py" "$out/"
echo "wrote $out/deviceplugin_pb2.py and $out/deviceplugin_pb2_grpc.py"
