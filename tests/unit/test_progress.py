"""StepProgress in a log (not a terminal): a line when a step starts, at each quarter and at the
end, with the elapsed time, the ETA and the note; nothing in between."""

from __future__ import annotations

import io

from rich.console import Console

from trtspec.cli.common import StepProgress


def test_plain_progress_prints_quarters_with_eta_and_note(monkeypatch):
    clock = iter(float(t) for t in range(1000))
    monkeypatch.setattr("trtspec.cli.common.time.monotonic", lambda: next(clock))
    buf = io.StringIO()
    with StepProgress(Console(file=buf, force_terminal=False, width=200)) as p:
        assert not p.live
        for step in range(1, 201):
            p.update("train target", step, 200, note=f"loss {9 - step / 100:.2f}")
        p.update("serve: models ready", 0, 6)
        p.update("serve: models ready", 6, 6)
    lines = buf.getvalue().splitlines()
    train = [x for x in lines if "train target" in x]
    assert [x.split()[2] for x in train] == ["1/200", "50/200", "100/200", "150/200", "200/200"]
    assert "eta" not in train[0] and "eta" not in train[-1]
    # 49 steps took 49 s since the first report: 150 steps left → 150 s
    assert "(49 s, eta 150 s)" in train[1] and train[1].endswith("loss 8.50")
    assert [x.split()[3] for x in lines if "models ready" in x] == ["0/6", "6/6"]
