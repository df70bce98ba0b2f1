"""Measured runs: what their files must hold (runrecord), reading and
re-simulating them on a profile (replay), and the work the executor did (executorwork)."""
