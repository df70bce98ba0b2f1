"""Measured runs, whose files the measured-run schema (policies.runs.measured) reads:
the record's parameters and file names checked (runrecord), how they must agree
with each other and with the platform they name (evidence), reading and
re-simulating them on a profile (replay), and the work the executor did (executorwork)."""
