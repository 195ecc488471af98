"""What the fault tests read from a command's stderr."""

from __future__ import annotations

import pytest


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one ``error: ...`` line a refused command printed (notes and warnings may precede
    it; a second error line or a traceback fails the test)."""
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
