"""The package's types as mypy sees them (`--strict`): its own code, the native module's stubs
(`_dagloop.pyi`), and these tests and the benchmark as typed users of every public class."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from conftest import ROOT


def test_mypy_strict_accepts_the_package_and_its_users() -> None:
    cache = pathlib.Path.home() / ".cache/dagloop/mypy-cache"
    paths = [str(ROOT / "python" / p) for p in ("dagloop", "tests", "bench")]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), *paths],
        capture_output=True, text=True, cwd=ROOT / "python",
    )
    assert done.returncode == 0, done.stdout + done.stderr
