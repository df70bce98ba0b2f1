"""Comparing schedules on a scenario: the Python API (api: ``compare(Scenario)``),
the scenario resolved and its work counted (scenario), parameter sweeps (sweep,
sweep_ray), tuned searches (tune), the latency-law view (lawviews) and the plotly
report (report)."""
