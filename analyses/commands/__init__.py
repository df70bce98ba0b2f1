"""One module per ``hetspec`` subcommand; see analyses.cli."""
