"""What a run is, for the simulator and the executor alike.

The settings every layer reads of a run (``config.RunSettings``), a run's files
in one format (``files``: the one span type ``Span``, exported to Chrome traces;
the run record with its writer and reader, the atomic file writing itself being
``hwprofiles.writing``; the run folder), its metrics (``metrics``: the one set of
run metrics with the one ``speedup_vs_ar``), where a run's time goes
(``breakdown``), the measured-run
schema (``measured``: the one span of a measured run, its files written and read
back by version); the acceptance-trace reader is
``policies.traces.read_acceptance``. simcore writes simulated runs and executors
measured runs through these modules; analyses read them back.

Why under policies/: the layering is hwprofiles, policies <- simcore, executors
<- analyses, and simcore and executors must not import each other. A module both
runtimes write through has to sit below both, and policies/ is the lower package
that already speaks of runs (operations, timelines measured from spans by label,
the acceptance trace); hwprofiles/ holds hardware and model data and the file
reading and writing every layer shares, no runs. Like every module of policies/, nothing
here imports simpy or torch.
"""
