"""Shared fixtures. The tiny pair is trained once per machine (cached in ./models, ~4 min).

`make test` runs the suite on two pytest-xdist workers (``-n 2 --dist loadfile``: a file's tests,
and so its module-scoped server, stay on one worker); the training is locked so that one worker
trains and the other waits for it, and each worker picks ports from its own range."""

from __future__ import annotations

import os
import pathlib
from collections import Counter

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
MODELS = REPO / "models"

# Files whose first minutes need no trained model (pip installs into fresh venvs): scheduled first,
# so that on a fresh checkout their installs run while the other worker trains the tiny pair
# instead of after it. The rest keep xdist's own default order, the files with most tests first
# (the Makefile turns xdist's reordering off so that this order is the one it follows).
EARLY_FILES = ("tests/pipeline/test_wheel.py",)


def pytest_collection_modifyitems(config, items) -> None:
    counts = Counter(item.nodeid.split("::")[0] for item in items)

    def rank(item) -> tuple:
        f = item.nodeid.split("::")[0]
        return (f not in EARLY_FILES, -counts[f], f)

    items.sort(key=rank)  # stable: a file's tests keep their order


@pytest.fixture(scope="session")
def tiny_models() -> tuple[pathlib.Path, pathlib.Path]:
    """(target_dir, draft_dir) of the project's tiny pair; trains it if missing."""
    if os.environ.get("TRTSPEC_TEST_NO_TRAIN") and not (MODELS / "tiny-target").is_dir():
        pytest.skip("the tiny pair is not trained and TRTSPEC_TEST_NO_TRAIN is set")
    import torch

    from trtspec.checkpoints.tiny import make_tiny_models

    from filelock import FileLock

    threads = torch.get_num_threads()
    MODELS.mkdir(exist_ok=True)
    with FileLock(str(MODELS / ".tiny-pair.lock")):  # another xdist worker may be training it
        res = make_tiny_models(MODELS)
    torch.set_num_threads(threads)
    return res.target_dir, res.draft_dir


@pytest.fixture(scope="session")
def tiny_target(tiny_models) -> pathlib.Path:
    return tiny_models[0]


@pytest.fixture(scope="session")
def tiny_draft(tiny_models) -> pathlib.Path:
    return tiny_models[1]


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO


def worker_threads() -> int:
    """torch threads for one test process: the cores shared by the xdist workers (2 workers on 2
    cores: 1 each). Two processes that each run 2 OpenMP threads on 2 cores stall each other's
    parallel regions: measured, test_sampled_speculation_matches_target_distribution took 7 s
    alone, 37 s beside a 2-thread neighbour and 9 s with 1 thread each (156 s in CI)."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return max(1, len(os.sched_getaffinity(0)) // _xdist_workers())


def _xdist_workers() -> int:
    return max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if _xdist_workers() > 1:
        # set before torch loads, and inherited by every server, stub and CLI process a test starts
        n = str(worker_threads())
        os.environ.setdefault("OMP_NUM_THREADS", n)
        os.environ.setdefault("MKL_NUM_THREADS", n)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...: disjoint port ranges, below
    if worker.startswith("gw") and worker[2:].isdigit():  # the kernel's ephemeral range (32768-)
        lo = 10_000 + 2_000 * int(worker[2:])
        os.environ.setdefault("TRTSPEC_PORT_RANGE", f"{lo}-{lo + 1_999}")
