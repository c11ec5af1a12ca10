#!/usr/bin/env bash
# Builds llama.cpp's command-line tools from source, once, for making goldens and running
# comparison benchmarks by hand. CI never runs this script; nothing in the test suite needs it.
#
#     scripts/llamacpp/build.sh [OUT_DIR]      # default: ${NNX_CACHE:-$HOME/.cache/nnx}/llama.cpp
#
# If OUT_DIR/bin already holds all the tools it exits at once. Otherwise it takes llama.cpp's
# sources from the llama-cpp-python source package on PyPI (pinned version, sha256 checked, the
# same package as make_goldens.sh), configures a CPU-only, statically linked Release build
# (-march=native, no OpenMP, no OpenSSL/curl, no server/UI, no tests) and builds only:
#
#     llama-tokenize llama-perplexity llama-bench llama-simple llama-completion
#     llama-quantize llama-eval-callback
#
# llama-simple and llama-completion both do non-interactive generation from a fixed prompt:
# llama-simple always samples greedily (`llama-simple -m M.gguf -n 32 "prompt"`); llama-completion
# takes the usual options (`llama-completion -m M.gguf -no-cnv --temp 0 -n 32 -p "prompt"`).
# The binaries go to OUT_DIR/bin, and OUT_DIR/VERSION records the package version, llama.cpp
# commit, compiler and flags. With GGML_NATIVE=ON they only run on CPUs like the build machine.
#
# Takes about 7-10 minutes on 2 recent x86 cores (152 build steps; longer on slower machines);
# compiles run under `nice -n 19` with JOBS=2 by default.
# Needs curl, tar, a C/C++17 compiler (gcc >= 9 or clang) and python3; cmake and ninja are
# installed with pip into the venv ${NNX_CACHE:-$HOME/.cache/nnx}/venv if missing there.
# Downloads and builds in OUT_DIR/.work, which is removed on success and kept on failure, so a
# rerun resumes the build.
set -euo pipefail

LCP_VERSION=0.3.36
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LCP_URL="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-${LCP_VERSION}.tar.gz"

TOOLS=(llama-tokenize llama-perplexity llama-bench llama-simple llama-completion llama-quantize
    llama-eval-callback)

cache="${NNX_CACHE:-$HOME/.cache/nnx}"
out="${1:-$cache/llama.cpp}"
venv="$cache/venv"
jobs="${JOBS:-2}"

have_all=1
for t in "${TOOLS[@]}"; do
    [[ -x "$out/bin/$t" ]] || { have_all=0; break; }
done
if [[ $have_all == 1 ]]; then
    echo "llama.cpp tools already built in $out/bin"
    exit 0
fi

start=$(date +%s)
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$out/.work"
mkdir -p "$work"

# Sources.
sdist="$work/llama_cpp_python-${LCP_VERSION}.tar.gz"
if ! { [[ -f "$sdist" ]] && echo "$LCP_SHA256  $sdist" | sha256sum -c --status -; }; then
    curl -fsSL -o "$sdist" "$LCP_URL"
    echo "$LCP_SHA256  $sdist" | sha256sum -c -
fi
top="llama_cpp_python-${LCP_VERSION}"
src="$work/$top/vendor/llama.cpp"
if [[ ! -f "$src/CMakeLists.txt" ]]; then
    tar -xzf "$sdist" -C "$work" "$top/vendor/llama.cpp"
fi
# The sdist carries the submodule's git metadata (no objects): HEAD is the llama.cpp commit.
commit=unknown
if tar -xzf "$sdist" -C "$work" "$top/.git/modules/vendor/llama.cpp/HEAD" 2>/dev/null; then
    head_line="$(head -n1 "$work/$top/.git/modules/vendor/llama.cpp/HEAD")"
    [[ $head_line =~ ^[0-9a-f]{40}$ ]] && commit="$head_line"
fi

# Build tools.
if [[ ! -x "$venv/bin/cmake" || ! -x "$venv/bin/ninja" ]]; then
    [[ -x "$venv/bin/pip" ]] || python3 -m venv "$venv"
    "$venv/bin/pip" install cmake ninja
fi
export PATH="$venv/bin:$PATH"

# Configure and build.
build="$work/build"
cmake_flags=(
    -G Ninja
    -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja"
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=ON
    -DGGML_OPENMP=OFF
    -DGGML_BLAS=OFF
    -DGGML_CCACHE=OFF
    -DGGML_BACKEND_DL=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_LLGUIDANCE=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_SERVER=OFF
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_EXAMPLES=ON
    -DLLAMA_BUILD_COMMIT="${commit:0:8}"
)
nice -n 19 "$venv/bin/cmake" -S "$src" -B "$build" "${cmake_flags[@]}"
nice -n 19 "$venv/bin/cmake" --build "$build" -j "$jobs" --target "${TOOLS[@]}"

# Install.
mkdir -p "$out/bin"
for t in "${TOOLS[@]}"; do
    install -m 755 "$build/bin/$t" "$out/bin/$t"
done
compiler="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")"
{
    echo "llama-cpp-python $LCP_VERSION (sdist sha256 $LCP_SHA256)"
    echo "llama.cpp commit $commit"
    echo "compiler $compiler ($("$compiler" --version | head -n1))"
    echo "cmake ${cmake_flags[*]:3}"
    echo "machine $(uname -m), built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "tools ${TOOLS[*]}"
} > "$out/VERSION"

rm -rf "$work"
elapsed=$(( $(date +%s) - start ))
echo "built ${TOOLS[*]} into $out/bin in $((elapsed / 60))m$((elapsed % 60))s"
