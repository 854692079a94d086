#!/usr/bin/env bash
# examples/cpp/get_onnxruntime.sh [PYTHON] — ONNX Runtime's C/C++ headers and shared library for the C++ example,
# from the registries this project reaches (nothing is downloaded at build or run time after this):
#   - the library: the PyPI `onnxruntime` wheel ships libonnxruntime.so (the venv's, found through PYTHON);
#   - the headers: neither that wheel, the npm `onnxruntime-node` package nor Debian 12 ships them; the npm package
#     com.github.asus4.onnxruntime (ONNX Runtime's Unity plugin, MIT) carries ONNX Runtime's own headers (C API
#     version 29, i.e. 1.29: a library of the same or a newer version serves them). Only its headers are kept.
# Writes examples/cpp/onnxruntime/{include,lib} (git-ignored); does nothing when they are there.
set -euo pipefail
cd "$(dirname "$0")"
PY=${1:-../../.venv/bin/python}
HEADERS_PACKAGE=com.github.asus4.onnxruntime@0.4.9
mkdir -p onnxruntime/include onnxruntime/lib
if [ ! -f onnxruntime/include/onnxruntime_cxx_api.h ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$HEADERS_PACKAGE" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" --wildcards '*ios-arm64_x86_64-simulator/onnxruntime.framework/Headers/*.h'
  cp "$tmp"/package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64_x86_64-simulator/onnxruntime.framework/Headers/*.h \
    onnxruntime/include/
fi
library=$("$PY" -c "import glob, os, onnxruntime; print(sorted(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), 'capi', 'libonnxruntime.so*')))[0])")
ln -sf "$library" onnxruntime/lib/libonnxruntime.so
ln -sf "$library" onnxruntime/lib/libonnxruntime.so.1  # its soname
echo "onnxruntime for C++: headers $(grep -m1 '#define ORT_API_VERSION' onnxruntime/include/onnxruntime_c_api.h), library $library"
