#!/usr/bin/env bash
# Writes the llama.cpp quantization goldens in tests/fixtures/gguf/quantize/ (`<TYPE>.input.f32`,
# `<TYPE>.llamacpp` for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS).
#
#     scripts/llamacpp/make_goldens.sh [OUT_DIR]
#
# It takes llama.cpp's sources from the llama-cpp-python source package on PyPI (pinned version,
# sha256 checked), compiles only ggml.c and ggml-quants.c with the driver quant_goldens.c and
# stubs.c (plain `cc -O2`, no fast-math), and runs the driver. Needs curl, tar and a C compiler.
set -euo pipefail

LCP_VERSION=0.3.36
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LCP_URL="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-${LCP_VERSION}.tar.gz"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/tests/fixtures/gguf/quantize}"
CC="${CC:-cc}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

sdist="$work/llama_cpp_python-${LCP_VERSION}.tar.gz"
curl -fsSL -o "$sdist" "$LCP_URL"
echo "$LCP_SHA256  $sdist" | sha256sum -c -

tar -xzf "$sdist" -C "$work" --wildcards "llama_cpp_python-${LCP_VERSION}/vendor/llama.cpp/ggml/*"
ggml="$work/llama_cpp_python-${LCP_VERSION}/vendor/llama.cpp/ggml"

# ggml.c includes the version header that CMake would generate.
mkdir -p "$work/gen"
printf '#define GGML_VERSION "%s"\n#define GGML_COMMIT "llama-cpp-python-%s"\n' \
    "$LCP_VERSION" "$LCP_VERSION" > "$work/gen/ggml-version.h"

# NDEBUG as in a release build of llama-quantize; no -march, so ggml's software fp16 conversion.
cflags=(-O2 -std=gnu11 -DNDEBUG -I"$ggml/include" -I"$ggml/src" -I"$work/gen")
"$CC" "${cflags[@]}" -c "$ggml/src/ggml-quants.c" -o "$work/ggml-quants.o"
"$CC" "${cflags[@]}" -c "$ggml/src/ggml.c" -o "$work/ggml.o"
"$CC" "${cflags[@]}" -c "$here/stubs.c" -o "$work/stubs.o"
"$CC" "${cflags[@]}" -c "$here/quant_goldens.c" -o "$work/quant_goldens.o"
"$CC" -o "$work/quant_goldens" "$work/quant_goldens.o" "$work/ggml-quants.o" "$work/ggml.o" \
    "$work/stubs.o" -lm -lpthread

mkdir -p "$out"
"$work/quant_goldens" "$out"
