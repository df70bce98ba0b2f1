"""The latency laws: the papers' closed forms (forms) and their terms filled
from the simulator's cost model (terms)."""
