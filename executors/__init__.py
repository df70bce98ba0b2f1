"""The real runtime: interprets schedule operations with torch on real devices.

The second interpreter of ``policies.ops`` (the first is ``simcore.engine``):
registered policies run unchanged, their operations become real computation.

* ``backend/``    — what runs on a device: weights and where they come from
  (``models``, ``drafts``), layer-range execution with KV caches (``layers``),
  the device and its commands (``device``), tensor-parallel shards (``tensor``),
  streamed layers (``streaming``), in-process and worker-process clients
  (``clients``, ``workers``) and what a worker process runs (``workerproc``).
* ``coordinate/`` — operations to device commands: the task loop (``loop``), the
  coordinator and its bookkeeping (``book``, ``feeds``), speculation and token
  trees (``trees``, ``tokentree``), CATS's correction branches (``branches``),
  real Outcome events (``observers``), the dry run (``footprint``).
* ``session/``   — a measured run's models (``loading``), devices (``devices``),
  each batch's dry run (``plan``), prefill (``prefill``) and decoding (``decode``).
* ``measure``, ``prompts`` — a measured run end to end and its record
  (``hetspec run``).
* ``train/``     — ``hetspec train-draft``: the draft heads' distillation
  (``distil``), its text (``corpus``), multi-token heads (``ahead``), settings
  (``config``).
"""
