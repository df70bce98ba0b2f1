import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tests.needs import HAS_MODEL, HAS_TORCH, NO_MODEL, NO_TORCH  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "torch: needs the torch extra (skipped without it)")


def pytest_collection_modifyitems(config, items):
    """Tests that need torch or the real model skip, saying why, where they are
    missing (tests/needs.py); the slow ones run first."""
    for item in items:
        if item.get_closest_marker("slow") or item.get_closest_marker("torch"):
            if not HAS_TORCH:
                item.add_marker(pytest.mark.skip(reason=NO_TORCH))
            elif item.get_closest_marker("slow") and not HAS_MODEL:
                item.add_marker(pytest.mark.skip(reason=NO_MODEL))
    # the model-loading tests first: each worker starts on the long ones and the short
    # ones fill in at the end, so the workers finish together (-n 2 --dist worksteal)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
