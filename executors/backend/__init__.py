"""What runs on a device: weights and where they come from (models, drafts),
layer-range execution with KV caches (layers), the device and its commands
(device), tensor-parallel shards (tensor), streamed layers (streaming), and the
clients that reach a device in process or in a worker process (clients, workers)."""
