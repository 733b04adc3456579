#!/usr/bin/env python
"""Why a served engine picks its own torch thread count (trtspec.speculative.engine.pick_thread_count).

Times one small matmul ([1,384]x[384,384], a tiny-model projection) and one large one
([1,1536]x[1536,8960], a Qwen-1.5B MLP) with 1 and 2 torch threads, on the main thread and on
another thread (where a Triton python model's engine runs). Prints microseconds per call.

    .venv/bin/python scripts/bench_thread_overhead.py
"""

from __future__ import annotations

import threading
import time

import torch


def per_call_us(a: torch.Tensor, w: torch.Tensor, threads: int, n: int) -> float:
    torch.set_num_threads(threads)
    for _ in range(20):
        a @ w
    t0 = time.perf_counter()
    for _ in range(n):
        a @ w
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    cases = {"small [1,384]x[384,384]": (torch.randn(1, 384), torch.randn(384, 384), 2000),
             "large [1,1536]x[1536,8960]": (torch.randn(1, 1536), torch.randn(1536, 8960), 200)}
    print(f"{'matmul':28} {'threads':>7} {'main thread us':>15} {'other thread us':>16}")
    for name, (a, w, n) in cases.items():
        for threads in (1, 2):
            main_us = per_call_us(a, w, threads, n)
            other: list[float] = []
            t = threading.Thread(target=lambda: other.append(per_call_us(a, w, threads, n)))
            t.start()
            t.join()
            print(f"{name:28} {threads:>7} {main_us:>15.1f} {other[0]:>16.1f}")


if __name__ == "__main__":
    main()
