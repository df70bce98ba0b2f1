"""Bad-input cases by class, one module each (see ``benchmarks/bad_inputs.py``).

A module defines ``register(h)``: ``h`` is the ``bad_inputs`` module, whose
``CASES_TABLE`` (id, what, command), ``FIXTURES`` (name -> builder of a file in
the case's directory), ``VARIANTS`` (name -> corruption of a copy of the base
measured run), ``SLOW`` and ``EXPECT`` (id -> "accept" | "refuse" | "either")
it extends. Ids start with the class's letter in ``h.GROUPS``.
"""
