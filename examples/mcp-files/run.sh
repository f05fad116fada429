#!/usr/bin/env bash
# Runs the mcp-files example from the CLI on a fresh temporary directory, offline: the
# filesystem MCP server comes from scripts/setup-mcp.sh's cache, the model is scripted.
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(scripts/setup-mcp.sh)"
DAGLOOP_MCP_FILES_DIR="$(mktemp -d)"
export DAGLOOP_MCP_NPM DAGLOOP_MCP_FILES_DIR
trap 'rm -rf "$DAGLOOP_MCP_FILES_DIR"' EXIT
# edit_file and move_file would ask a reviewer: without a terminal, reject them (never called).
cargo run -q -- run examples/mcp-files/goal.json --on-no-reviewer reject "$@"
