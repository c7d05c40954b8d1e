"""The progress bar: phases, and an ETA from the phase's own pace."""

from __future__ import annotations

import io

from dabench_ir import progress as progress_mod
from dabench_ir.progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_shows_the_phase_and_times_each_phase_apart(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: now[0])
    out = _Tty()
    p = Progress(stream=out)
    p.bar(0, 2, phase="exporting models")
    assert "exporting models [" in out.getvalue() and "0/2" in out.getvalue() and "ETA -" in out.getvalue()
    now[0] = 160.0
    p.bar(1, 2, phase="exporting models")
    assert out.getvalue().rstrip().endswith("1/2 (60s elapsed, ETA 60s)")
    now[0] = 220.0
    p.bar(3, 10)  # the points begin: 3 were done by an earlier run, none timed yet
    assert out.getvalue().rstrip().endswith("3/10 (120s elapsed, ETA -)")
    now[0] = 230.0
    p.bar(5, 10)  # 2 points in 10 s: 5 left take 25 s (the 60 s exports do not count)
    assert out.getvalue().rstrip().endswith("5/10 (130s elapsed, ETA 25s)")
