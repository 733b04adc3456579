"""Summarise engine step traces: where a served engine's time went, per (batch, draft length, reason).

Serve with ``TRTSPEC_STEP_TRACE=PREFIX`` in the environment and every engine worker appends one
JSON line per prefill and per step to ``PREFIX.<method>.<pid>.jsonl`` (trtspec/triton/backend/worker.py;
``method`` is ``draft_target``, ``eagle3``, ``ngram`` or ``none`` for a baseline). Then:

    python scripts/step_trace_summary.py PREFIX [--out FILE.md]

For each trace file: steps and prefills, and per (B, k, why) the step count, the median step and
verify milliseconds, the median gap since the step before (the loop's own work: committing,
delivering, admitting), the total seconds and share, the tokens the draft read late (catch-up) and
the tokens the steps committed; for drafting rows, the goodput policy's expected gain over plain
decoding (median of the steps' ``gain``; traces before it was recorded show –) and the gain measured:
the rows' tokens/s over that of all k = 0 steps at the same B in the file. Comparing a speculative engine's k = 0 rows with the baseline's at
the same B shows whether plain steps of the speculative deployment cost what the baseline's do.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import statistics
import sys


def summarise(path: str) -> list[str]:
    events = [json.loads(line) for line in open(path) if line.strip()]
    steps = [e for e in events if e.get("event") == "step"]
    prefills = [e for e in events if e.get("event") == "prefill"]
    if not steps:
        return [f"## {path}: no steps", ""]
    pre_ms = [e["ms"] for e in prefills]
    out = [f"## {path}", "",
           f"{len(steps)} steps; {len(prefills)} prefills"
           + (f" (median {statistics.median(pre_ms):.0f} ms, {sum(pre_ms) / 1e3:.1f} s in all)" if pre_ms else ""), "",
           "| B | k | why | steps | step ms (median) | verify ms | gap ms | seconds | share | read late | tokens "
           "| tokens/s | gain expected | gain measured |",
           "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    groups = collections.defaultdict(list)
    for e in steps:
        groups[(e["B"], e["k"], str(e.get("why")))].append(e)
    total = sum(e["ms"] for e in steps)
    # plain decoding's tokens/s at each B (all k = 0 steps): what a drafting group's tokens/s is measured against
    plain = collections.defaultdict(lambda: [0, 0.0])
    for e in steps:
        if e["k"] == 0:
            plain[e["B"]][0] += e["B"]
            plain[e["B"]][1] += e["ms"] / 1e3
    for (B, k, why), v in sorted(groups.items()):
        ms = [e["ms"] for e in v]
        gaps = [e["since_last_ms"] for e in v if e.get("since_last_ms") is not None]
        tokens = sum(e["accepted"] + e["B"] for e in v)
        expected = [e["gain"] for e in v if e.get("gain") is not None]
        base = plain[B][0] / plain[B][1] if plain[B][1] else None
        gains = (f" | {statistics.median(expected):.3f}" if expected else " | –") + \
                (f" | {tokens / (sum(ms) / 1e3) / base:.3f}" if base and k else " | –")
        out.append(f"| {B} | {k} | {why} | {len(v)} | {statistics.median(ms):.1f} | "
                   f"{statistics.median(e['verify_ms'] for e in v):.1f} | "
                   f"{statistics.median(gaps) if gaps else float('nan'):.1f} | {sum(ms) / 1e3:.1f} | "
                   f"{sum(ms) / total:.1%} | {sum(e.get('late', 0) for e in v)} | {tokens} | "
                   f"{tokens / (sum(ms) / 1e3):.1f}{gains} |")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prefix", help="the TRTSPEC_STEP_TRACE prefix the server ran with")
    ap.add_argument("--out", default=None, help="also write the tables to this Markdown file")
    args = ap.parse_args(argv)
    paths = sorted(glob.glob(glob.escape(args.prefix) + ".*.jsonl"))
    if not paths:
        print(f"no trace files {args.prefix}.*.jsonl: serve with TRTSPEC_STEP_TRACE={args.prefix}", file=sys.stderr)
        return 2
    lines = [line for p in paths for line in summarise(p)]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
