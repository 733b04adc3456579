"""Shared fixtures. The tiny pair is trained once per machine (cached in ./models, ~4 min).

`make test` runs the suite on two pytest-xdist workers (``-n 2 --dist loadfile``: a file's tests,
and so its module-scoped server, stay on one worker); the training is locked so that one worker
trains and the other waits for it, and each worker picks ports from its own range."""

from __future__ import annotations

import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
MODELS = REPO / "models"


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


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...: disjoint port ranges, below
    if worker.startswith("gw") and worker[2:].isdigit():  # the kernel's ephemeral range (32768-)
        lo = 10_000 + 2_000 * int(worker[2:])
        os.environ.setdefault("TRTSPEC_PORT_RANGE", f"{lo}-{lo + 1_999}")
