"""Moved to ``policies.runs.files`` (shared by the simulator and the executor);
this name stays so code written against it keeps importing."""

from policies.runs.files import Span, chrome_trace, write_chrome_trace  # noqa: F401
