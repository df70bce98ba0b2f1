"""Run the ``hetspec`` command line in process and judge how it refuses bad input.

The reliability tests feed the CLI inputs a user or an attacker could give it. A
refusal is judged as a user sees it: exit status other than 0, the last line on
stderr is one ``error:`` sentence, no Python traceback, and it happens within a
hang guard (tests/hangguard.py: a hang fails the test instead of stalling the suite).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import signal
from dataclasses import dataclass
from pathlib import Path

try:  # imported as tests.clicases and, by some files, as clicases
    from tests.hangguard import HANG_S
except ImportError:
    from hangguard import HANG_S


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def sentence(self) -> str:
        lines = [ln for ln in self.err.splitlines() if ln.strip()]
        return lines[-1] if lines else ""


class Hang(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise Hang in the main thread once ``seconds`` of wall time have passed."""
    def _alarm(_sig, _frame):
        raise Hang(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(*argv: str, timeout_s: float = HANG_S) -> Result:
    """``hetspec ARGV...`` in this process; exceptions that escape main() propagate
    (a traceback is a failure of the test, with the traceback shown)."""
    from analyses.cli import main

    out, err = io.StringIO(), io.StringIO()
    with deadline(timeout_s), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse's own usage errors
            rc = exc.code if isinstance(exc.code, int) else 1
    return Result(int(rc), out.getvalue(), err.getvalue())


def assert_refused(result: Result, *fragments: str) -> None:
    """Non-zero exit, one error sentence last on stderr, no traceback; each fragment
    (case-insensitive) appears in that sentence."""
    assert result.rc != 0, f"accepted (exit 0): {result.out[-300:]!r}"
    assert "Traceback" not in result.err, result.err
    sentence = result.sentence
    assert "error:" in sentence, f"last stderr line is not an error sentence: {result.err!r}"
    message = sentence.split("error:", 1)[1].strip()
    assert message and "\n" not in message
    for fragment in fragments:
        assert fragment.lower() in sentence.lower(), (fragment, sentence)


def digest(path: Path) -> tuple[str, int]:
    """Content hash and mode of a file, to show an input was left untouched."""
    path = Path(path)
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mode
