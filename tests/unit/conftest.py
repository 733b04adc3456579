"""The fast tier: no trained models, no tritonserver. A test here that asks for the tiny pair fails
(it belongs in tests/engine, or tests/serving if it also starts a server)."""

import pytest


@pytest.fixture(scope="session")
def tiny_models():
    pytest.fail("tests/unit must not need the trained tiny pair: move this test to tests/engine")
