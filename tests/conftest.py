"""Shared fixtures. The tiny pair is trained once per machine (cached in ./models, ~5 min)."""

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

    threads = torch.get_num_threads()
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
