"""One module per ``hetspec`` subcommand (``train-draft``: ``train_draft.py``), each
defining ``register(subparsers)``; see analyses.cli.

``COMMANDS`` holds each command's one-line help: ``hetspec --help`` lists the
commands from it without importing their modules (each imports what it runs: the
schedules, scipy, plotly), and each module's parser takes its help from here.
tests/test_cli.py ties the table to the modules.
"""

COMMANDS = {
    "calibrate": "fit a profile's cost-model parameters to measured runs",
    "compare": "compare policies over a sweep and write an HTML report",
    "fit": "what fits: largest batch, longest context, fewest devices, layouts",
    "law": "evaluate a closed-form latency law",
    "profiles": "list, show, validate or import hardware, model and software-stack profiles",
    "replay": "re-simulate a measured run and compare the two",
    "run": "run one schedule for real with torch on this machine's devices",
    "serve": "simulate a serving engine under load: arrivals, continuous batching, SLOs",
    "simulate": "simulate one schedule on a hardware profile",
    "train-draft": "train the target's own draft heads (early exits, adapters, multi-token "
                   "heads)",
}
