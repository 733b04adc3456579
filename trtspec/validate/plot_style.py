"""What every validation plot shares: the two models' colours and labels, and matplotlib on the
file-only Agg backend (imported when a plot is drawn, so that reading results needs no matplotlib)."""

from __future__ import annotations

COLORS = {"baseline": "#1f77b4", "speculative": "#ff7f0e"}
LABELS = {"baseline": "baseline", "speculative": "speculative"}


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (plots are written to files, never shown)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt
