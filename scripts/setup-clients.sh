#!/usr/bin/env bash
# Generates the API's clients from the committed OpenAPI document (schemas/openapi.json), as a
# program's author would: a Python client with openapi-python-client (PyPI, pinned, in a venv at
# ${DAGLOOP_CACHE:-$HOME/.cache/dagloop}/clients-venv) and a TypeScript type file with
# openapi-typescript (npm, pinned, in .../npm-clients). The clients are written to
# .../clients/<sha256 of the document>/ (python/ and dagloop.d.ts), so a changed document gets
# new clients and an unchanged one reuses them. tests/server_clients.rs drives the server
# through the Python client.
#
# On success it prints, ready for `eval`:
#   export DAGLOOP_CLIENTS_PYTHON=/path/to/venv/bin/python  (has the client's dependencies)
#   export DAGLOOP_CLIENTS_DIR=/path/to/clients/<hash>       (python/dagloop_client, for
#                                                            PYTHONPATH, and dagloop.d.ts)
# Everything else goes to stderr.
#
# Usage:  eval "$(scripts/setup-clients.sh)"
#         cargo test --test server_clients
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_CLIENT_VERSION="${PYTHON_CLIENT_VERSION:-0.29.1}"
TYPESCRIPT_VERSION="${TYPESCRIPT_VERSION:-7.13.0}"
CACHE="${DAGLOOP_CACHE:-$HOME/.cache/dagloop}"
VENV="$CACHE/clients-venv"
PY="$VENV/bin/python"
NPM_DIR="$CACHE/npm-clients"
DOC="$PWD/schemas/openapi.json"

log() { echo "setup-clients: $*" >&2; }

mkdir -p "$CACHE"
if [ ! -x "$PY" ]; then
    log "creating venv at $VENV"
    "${PYTHON:-python3}" -m venv "$VENV" >&2
fi
if ! "$PY" -m pip show openapi-python-client 2>/dev/null | grep -x "Version: $PYTHON_CLIENT_VERSION" >/dev/null; then
    log "installing openapi-python-client $PYTHON_CLIENT_VERSION"
    "$PY" -m pip install --quiet "openapi-python-client==$PYTHON_CLIENT_VERSION" >&2
fi

STAMP="$NPM_DIR/.pinned-$TYPESCRIPT_VERSION"
if [ ! -f "$STAMP" ]; then
    command -v npm >/dev/null || { log "npm is required (apt-get install npm)"; exit 1; }
    mkdir -p "$NPM_DIR"
    [ -f "$NPM_DIR/package.json" ] || echo '{"name": "dagloop-clients", "private": true}' > "$NPM_DIR/package.json"
    log "installing openapi-typescript $TYPESCRIPT_VERSION"
    npm install --prefix "$NPM_DIR" --no-audit --no-fund --save-exact \
        "openapi-typescript@$TYPESCRIPT_VERSION" >&2
    touch "$STAMP"
fi

HASH="$(sha256sum "$DOC" | cut -c1-16)"
OUT="$CACHE/clients/$HASH-$PYTHON_CLIENT_VERSION-$TYPESCRIPT_VERSION"
if [ ! -f "$OUT/.done" ]; then
    log "generating clients for schemas/openapi.json ($HASH) into $OUT"
    rm -rf "$OUT"
    mkdir -p "$OUT/python"
    # `--meta none`: the package alone (python/dagloop_client), used through PYTHONPATH; no
    # formatting hooks (they would need ruff).
    echo 'post_hooks: []' > "$OUT/config.yaml"
    "$VENV/bin/openapi-python-client" generate --path "$DOC" --meta none \
        --config "$OUT/config.yaml" --output-path "$OUT/python/dagloop_client" >&2
    "$NPM_DIR/node_modules/.bin/openapi-typescript" "$DOC" --output "$OUT/dagloop.d.ts" >&2
    touch "$OUT/.done"
else
    log "reusing the clients of schemas/openapi.json ($HASH)"
fi
PYTHONPATH="$OUT/python" "$PY" -c 'import dagloop_client' >&2
echo "export DAGLOOP_CLIENTS_PYTHON=$PY"
echo "export DAGLOOP_CLIENTS_DIR=$OUT"
