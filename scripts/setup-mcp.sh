#!/usr/bin/env bash
# Installs the MCP servers the tests (tests/mcp.rs) and examples/mcp-files use, from the npm
# registry, at pinned versions, into ~/.cache/dagloop/npm (outside the checkout). Reused when the
# pinned versions are already there. Prints `export DAGLOOP_MCP_NPM=...` for `eval`.
set -euo pipefail
EVERYTHING_VERSION=2026.8.31
FILESYSTEM_VERSION=2026.8.31
# The SDK itself, for the test servers written in JavaScript (tests/fixtures/mcp/*.cjs).
SDK_VERSION=1.32.2
DIR="${DAGLOOP_MCP_NPM:-$HOME/.cache/dagloop/npm}"
STAMP="$DIR/.pinned-$EVERYTHING_VERSION-$FILESYSTEM_VERSION-$SDK_VERSION"
if [ ! -f "$STAMP" ]; then
    command -v npm >/dev/null || { echo "setup-mcp.sh: npm is required (apt-get install npm)" >&2; exit 1; }
    mkdir -p "$DIR"
    [ -f "$DIR/package.json" ] || echo '{"name": "dagloop-mcp-servers", "private": true}' > "$DIR/package.json"
    npm install --prefix "$DIR" --no-audit --no-fund --save-exact \
        "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION" \
        "@modelcontextprotocol/server-filesystem@$FILESYSTEM_VERSION" \
        "@modelcontextprotocol/sdk@$SDK_VERSION" >&2
    touch "$STAMP"
fi
echo "export DAGLOOP_MCP_NPM=$DIR"
