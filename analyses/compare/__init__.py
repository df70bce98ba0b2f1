"""Comparing schedules on a scenario: parameter sweeps (sweep, sweep_ray), the
latency-law view (lawviews) and the plotly report (report)."""
