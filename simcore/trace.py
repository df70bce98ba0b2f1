"""Moved to ``policies.runs.spans`` (shared by the simulator and the executor);
this name stays so code written against it keeps importing."""

from policies.runs.spans import Span, chrome_trace, write_chrome_trace  # noqa: F401
