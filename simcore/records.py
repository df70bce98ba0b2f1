"""Moved to ``policies.runs.records`` (shared by the simulator and the executor);
this name stays so code written against it keeps importing."""

from policies.runs.records import *  # noqa: F401,F403
