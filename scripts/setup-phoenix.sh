#!/usr/bin/env bash
# Installs Arize Phoenix (PyPI `arize-phoenix`, pinned), an OpenTelemetry collector and trace
# viewer, into a Python virtual environment outside the checkout, at
# ${DAGLOOP_CACHE:-$HOME/.cache/dagloop}/phoenix-venv, for tests/otel_phoenix.rs (the spans a
# run exports over OTLP, read back through Phoenix's API). A large install (a web app and its
# Python dependencies); done once, then reused.
#
# On success it prints one line on stdout, ready for `eval`:
#   DAGLOOP_PHOENIX=/path/to/venv/bin/phoenix
# Everything else goes to stderr.
#
# Usage:  eval "$(scripts/setup-phoenix.sh)" && export DAGLOOP_PHOENIX
#         cargo test --test otel_phoenix
set -euo pipefail

PHOENIX_VERSION="${PHOENIX_VERSION:-20.26.1}"
CACHE="${DAGLOOP_CACHE:-$HOME/.cache/dagloop}"
VENV="$CACHE/phoenix-venv"
PY="$VENV/bin/python"
BASE_PYTHON="${PYTHON:-python3}"

log() { echo "setup-phoenix: $*" >&2; }

mkdir -p "$CACHE"
if [ ! -x "$PY" ]; then
    log "creating venv at $VENV"
    "$BASE_PYTHON" -m venv "$VENV" >&2
fi

if "$PY" -m pip show arize-phoenix 2>/dev/null | grep -x "Version: $PHOENIX_VERSION" >/dev/null; then
    log "reusing arize-phoenix $PHOENIX_VERSION"
else
    start=$(date +%s)
    log "installing arize-phoenix $PHOENIX_VERSION (large: a few minutes the first time)"
    "$PY" -m pip install --disable-pip-version-check -q "arize-phoenix==$PHOENIX_VERSION" >&2
    log "installed in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1) on disk"
fi
[ -x "$VENV/bin/phoenix" ] || { log "no phoenix command in $VENV/bin"; exit 1; }

echo "DAGLOOP_PHOENIX=$VENV/bin/phoenix"
