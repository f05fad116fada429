"""Exiting the interpreter while the native module's threads are handing values back: the
`atexit` hook the module registers waits for them (GIL released) and shuts its runtime down,
so no thread takes or holds the GIL once the interpreter finalizes (before, about one exit in
eight aborted with "Fatal Python error: PyGILState_Release: thread state ... must be current
when releasing" or a segfault)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

# Chains of native calls, each answer asking for the next (a `replay` of a store that does not
# exist fails at once), with some Python work under the GIL in every answer: when the script
# ends, runtime threads hold or await the GIL all the time.
SCRIPT = textwrap.dedent(
    """
    import sys, time
    from dagloop import _dagloop as native

    def done(value, error):
        sum(range(100_000))
        native.replay(sys.argv[1], "run-x", done)

    for _ in range(4):
        native.replay(sys.argv[1], "run-x", done)
    time.sleep(0.05)
    """
)

RUNS, AT_ONCE = 16, 4


def test_exiting_while_values_are_handed_back_never_aborts(tmp_path: Path) -> None:
    script = tmp_path / "exit_while_answering.py"
    script.write_text(SCRIPT)
    failures = []
    for start in range(0, RUNS, AT_ONCE):
        procs = [
            subprocess.Popen([sys.executable, str(script), str(tmp_path / "no-store")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(start, min(start + AT_ONCE, RUNS))
        ]
        for p in procs:
            out, err = p.communicate(timeout=60)
            if p.returncode != 0 or "Fatal Python error" in err:
                failures.append((p.returncode, err[-400:]))
    assert not failures, f"{len(failures)} of {RUNS} exits failed: {failures[:2]}"


def test_after_the_exit_hook_a_native_call_fails_and_nothing_is_handed_back(tmp_path: Path) -> None:
    script = tmp_path / "after_exit_hook.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from dagloop import _dagloop as native

            answers = []
            native.replay(sys.argv[1], "run-x", lambda v, e: answers.append(e))
            time.sleep(0.5)
            assert answers and answers[0][0] == "store.not_found", answers
            native._exiting()  # what the atexit hook does
            try:
                native.replay(sys.argv[1], "run-x", lambda v, e: answers.append(e))
            except RuntimeError as e:
                print("refused:", e)
            time.sleep(0.2)
            print("answers:", len(answers))
            """
        )
    )
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "no-store")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "refused: no tokio runtime: the interpreter is exiting" in done.stdout
    assert "answers: 1" in done.stdout
