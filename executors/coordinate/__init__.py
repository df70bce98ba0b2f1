"""A schedule's operations turned into device commands: the task loop (loop),
the coordinator, its bookkeeping (book, feeds), speculation and token trees
(trees, tokentree), correction branches (branches), real Outcome events
(observers) and the dry run that finds what a schedule touches (footprint)."""
