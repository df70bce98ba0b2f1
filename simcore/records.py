"""Moved to ``policies.runs.files`` (shared by the simulator and the executor);
this name stays so code written against it keeps importing."""

from policies.runs.files import *  # noqa: F401,F403
