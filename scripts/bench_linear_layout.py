#!/usr/bin/env python
"""Why CausalLM.fuse_ stores fp32 CPU weights input-major (trtspec.speculative.model).

Times F.linear for the tiny target's projections (fused q/k/v, o, fused gate/up, down, LM head)
with 1 and 5 rows (one decode step vs verifying 4 draft tokens + 1), for the usual ``[out, in]``
contiguous weight and for the same values stored ``[in, out]`` contiguous (seen through a
transposed view). Prints microseconds per call and writes bench/results/linear_layout.json.

    .venv/bin/python scripts/bench_linear_layout.py
"""

from __future__ import annotations

import json
import pathlib
import time

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (640, 384), "o_proj": (384, 384), "gate_up": (2304, 384), "down_proj": (384, 1152),
          "lm_head": (4096, 384)}


def per_call_us(x: torch.Tensor, w: torch.Tensor, n: int = 500) -> float:
    for _ in range(50):
        F.linear(x, w)
    t0 = time.perf_counter()
    for _ in range(n):
        F.linear(x, w)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    torch.set_num_threads(2)
    rows = []
    print(f"{'weight':10} {'shape':>12} {'rows':>4} {'[out,in] us':>12} {'[in,out] us':>12}")
    for name, (n_out, n_in) in SHAPES.items():
        w = torch.randn(n_out, n_in)
        w_im = w.t().contiguous().t()
        for m in (1, 5):
            x = torch.randn(1, m, n_in)
            usual, im = per_call_us(x, w), per_call_us(x, w_im)
            rows.append({"weight": name, "shape": [n_out, n_in], "rows": m, "out_in_us": round(usual, 1),
                         "in_out_us": round(im, 1)})
            print(f"{name:10} {str((n_out, n_in)):>12} {m:>4} {usual:>12.1f} {im:>12.1f}")
    for key in ("out_in_us", "in_out_us"):
        one = sum(r[key] for r in rows if r["rows"] == 1)
        five = sum(r[key] for r in rows if r["rows"] == 5)
        print(f"layout {key[:-3]}: 5 rows cost {five / one:.2f}x one row (sum over the shapes)")
    out = pathlib.Path("bench/results/linear_layout.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"threads": 2, "torch": torch.__version__, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
