#!/usr/bin/env bash
# examples/cpp/build.sh — builds examples/cpp/classify against ONNX Runtime's C++ API (get_onnxruntime.sh first).
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -f onnxruntime/include/onnxruntime_cxx_api.h ] || [ ! -e onnxruntime/lib/libonnxruntime.so ]; then
  echo "build.sh: no ONNX Runtime headers/library in examples/cpp/onnxruntime: run examples/cpp/get_onnxruntime.sh" >&2
  exit 2
fi
lib=$(pwd)/onnxruntime/lib
${CXX:-g++} -O2 -std=c++17 -Wall -Ionnxruntime/include classify.cpp -o classify -L"$lib" -lonnxruntime -Wl,-rpath,"$lib"
echo "built examples/cpp/classify"
