"""Training the target's draft heads (``hetspec train-draft``).

* ``config``  — the settings, importable without torch (the CLI's help reads them).
* ``corpus``  — the text the heads distil on.
* ``distil``  — the teacher's pass, the draft vocabulary, every head's training
  and the artifact (``train``).
* ``ahead``   — the multi-token heads, trained last from the same states.

This package imports nothing at load, so ``executors.train.config`` stays free of
torch.
"""
