#!/usr/bin/env bash
# Sets up the grammar engines the composed schema is tested on (tests/grammar_engines.rs):
# llguidance (used by llama.cpp and vLLM) and outlines-core (used by vLLM and TGI), pinned, in a
# Python virtual environment outside the checkout, at
# ${DAGLOOP_CACHE:-$HOME/.cache/dagloop}/grammar-venv. Both ship prebuilt wheels, so this takes
# seconds. The third engine, llama.cpp's JSON-Schema-to-grammar, comes from the llama-cpp-python
# build of scripts/setup-local-model.sh.
#
# On success it prints one line on stdout, ready for `eval`:
#   DAGLOOP_GRAMMAR_PYTHON=/path/to/venv/bin/python
# Everything else goes to stderr.
#
# Usage:  eval "$(scripts/setup-grammar-engines.sh)" && export DAGLOOP_GRAMMAR_PYTHON
#         cargo test --test grammar_engines
set -euo pipefail

LLGUIDANCE_VERSION="${LLGUIDANCE_VERSION:-1.9.1}"
OUTLINES_CORE_VERSION="${OUTLINES_CORE_VERSION:-0.2.14}"
CACHE="${DAGLOOP_CACHE:-$HOME/.cache/dagloop}"
VENV="$CACHE/grammar-venv"
PY="$VENV/bin/python"
BASE_PYTHON="${PYTHON:-python3}"

log() { echo "setup-grammar-engines: $*" >&2; }

mkdir -p "$CACHE"
if [ ! -x "$PY" ]; then
    log "creating venv at $VENV"
    "$BASE_PYTHON" -m venv "$VENV" >&2
fi

have_version() { # package version -> 0 when installed at that version
    "$PY" -m pip show "$1" 2>/dev/null | grep -x "Version: $2" >/dev/null  # not -q: an early exit would SIGPIPE pip and fail under pipefail
}

if have_version llguidance "$LLGUIDANCE_VERSION" && have_version outlines_core "$OUTLINES_CORE_VERSION"; then
    log "reusing llguidance $LLGUIDANCE_VERSION and outlines-core $OUTLINES_CORE_VERSION"
else
    start=$(date +%s)
    log "installing llguidance $LLGUIDANCE_VERSION and outlines-core $OUTLINES_CORE_VERSION"
    "$PY" -m pip install "llguidance==$LLGUIDANCE_VERSION" "outlines-core==$OUTLINES_CORE_VERSION" >&2
    log "installed in $(( $(date +%s) - start )) s"
fi
"$PY" -c 'import llguidance, outlines_core' >&2

echo "DAGLOOP_GRAMMAR_PYTHON=$PY"
