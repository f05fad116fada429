#!/usr/bin/env bash
# The Python package `dagloop` (python/: PyO3 + maturin) built into a venv in
# ~/.cache/dagloop/py-venv: maturin, pytest, pydantic and mypy from PyPI (pinned, installed once), then
# `maturin develop` (dev profile) into the venv. The Rust build goes to CARGO_TARGET_DIR like the
# rest of the project's, so a second run only relinks what changed. Prints
# `export DAGLOOP_PYTHON=...` (eval it); progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="$HOME/.cache/dagloop/py-venv"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/dagloop/target}"
PINS=(maturin==1.16.0 pytest==9.2.0 pydantic==2.14.4 mypy==2.4.1)

if ! "$VENV/bin/python" -c "import pydantic, pytest, mypy" 2>/dev/null || [ ! -x "$VENV/bin/maturin" ]; then
    echo "setup-python: creating $VENV (${PINS[*]})" >&2
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install -q "${PINS[@]}" >&2
fi
echo "setup-python: building the package into $VENV (maturin develop)" >&2
VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" "$VENV/bin/maturin" develop -q -m python/Cargo.toml >&2
echo "export DAGLOOP_PYTHON=$VENV/bin/python"
