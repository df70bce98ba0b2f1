"""Measured runs: what their files must hold (runrecord), how they must agree
with each other and with the platform they name (evidence), reading and
re-simulating them on a profile (replay), and the work the executor did (executorwork)."""
