"""How long a test waits on a command before it calls it a hang.

These are hang guards, not speed checks: a hang fails its test instead of stalling
the suite until CI's 90-minute limit, and a slow machine never fails one. Speed is
measured by the scripts under benchmarks/, never asserted here.

Sized for a loaded two-core machine: the slowest command a test waits on in
process (the kangaroo repro in test_resources_property.py, 8,000 tokens with its
AR baseline) took about 30 s on an idle core, and at a load average of 10 on two
cores a process gets about a fifth of a core (150 s); twice that is ``HANG_S``.
A subprocess that loads the real model, or the README's tour of several commands,
took about 2 minutes on an idle core; five times that and a margin is ``MODEL_HANG_S``.
"""

HANG_S = 300.0
MODEL_HANG_S = 1200.0
