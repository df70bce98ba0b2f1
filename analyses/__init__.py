"""On top of both runtimes: laws, runs, comparisons, calibration and the CLI.

* ``laws/``      — the papers' closed forms and their terms from the cost model.
* ``run/``       — one run's configuration, the Python API, the memory check, the
  output guard.
* ``measured/``  — measured runs: checked, read, replayed on a profile.
* ``compare/``   — sweeps, the latency-law view and the plotly report.
* ``calibrate/`` — profiles fitted to measured runs and to published measurements.
* ``cli``, ``commands/`` — the command line, one module per subcommand.
"""
