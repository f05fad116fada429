#!/usr/bin/env bash
# The Python package `dagloop` (python/: PyO3 + maturin) built into a virtual environment outside
# the checkout, at ${DAGLOOP_PY_VENV:-${DAGLOOP_CACHE:-$HOME/.cache/dagloop}/py-venv}: maturin,
# pytest, pydantic, mypy, and FastAPI with httpx (the docs' endpoint example is called through its
# TestClient) from PyPI (pinned; installed again only when the pins change), then `maturin develop`
# (dev profile) into the venv. The Rust build goes to CARGO_TARGET_DIR like the rest of the
# project's (default ~/.cache/dagloop/target), so a later run only relinks what changed.
#
# With DAGLOOP_PY_PROFILE=release (what python/bench/overhead.py is measured with), the native
# module is built optimised instead: a wheel (`maturin build --release`, kept in
# ~/.cache/dagloop/wheels) installed into ${DAGLOOP_PY_VENV:-~/.cache/dagloop/py-venv-release},
# so the release and dev builds never overwrite each other's module.
#
# On success it prints one line on stdout, ready for `eval`:
#   export DAGLOOP_PYTHON=/path/to/venv/bin/python
# Everything else goes to stderr.
#
# Usage:  eval "$(scripts/setup-python.sh)" && "$DAGLOOP_PYTHON" -m pytest python/tests
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${DAGLOOP_CACHE:-$HOME/.cache/dagloop}"
PROFILE="${DAGLOOP_PY_PROFILE:-dev}"
case "$PROFILE" in
    dev) VENV="${DAGLOOP_PY_VENV:-$CACHE/py-venv}" ;;
    release) VENV="${DAGLOOP_PY_VENV:-$CACHE/py-venv-release}" ;;
    *) echo "setup-python: DAGLOOP_PY_PROFILE is dev or release, not $PROFILE" >&2; exit 2 ;;
esac
PY="$VENV/bin/python"
BASE_PYTHON="${PYTHON:-python3}"
PINS="maturin==1.16.0 pytest==9.2.0 pydantic==2.14.4 mypy==2.4.1 fastapi==0.165.0 httpx==0.28.1"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"

log() { echo "setup-python: $*" >&2; }

mkdir -p "$CACHE"
if [ ! -x "$PY" ]; then
    log "creating venv at $VENV"
    "$BASE_PYTHON" -m venv "$VENV" >&2
fi
if [ "$(cat "$VENV/.dagloop-pins" 2>/dev/null)" != "$PINS" ]; then
    log "installing $PINS"
    # shellcheck disable=SC2086 # one word per pin
    "$PY" -m pip install -q $PINS >&2
    echo "$PINS" > "$VENV/.dagloop-pins"
fi
start=$(date +%s)
if [ "$PROFILE" = release ]; then
    log "building a release wheel of the package into $VENV (maturin build --release)"
    rm -f "$CACHE"/wheels/dagloop-*.whl
    "$VENV/bin/maturin" build -q --release -i "$PY" -o "$CACHE/wheels" -m python/Cargo.toml >&2
    "$PY" -m pip install -q --force-reinstall --no-deps "$CACHE"/wheels/dagloop-*.whl >&2
else
    log "building the package into $VENV (maturin develop)"
    VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" "$VENV/bin/maturin" develop -q -m python/Cargo.toml >&2
fi
log "built in $(( $(date +%s) - start )) s"
echo "export DAGLOOP_PYTHON=$PY"
