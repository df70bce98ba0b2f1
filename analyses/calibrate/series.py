"""A source's speedup against batch, judged as a curve: per batch and where it crosses 1.

A published row may name the ``series`` it belongs to: one curve of its source in
which the batch is the only setting that changes (SpecDecode-Bench's draft model on
one dataset at batch 1, 16, 64 and 128). Each series is judged as the batch regime
asks of a held-out speculative source: its speedup within ``SERIES_GOAL`` at every
batch it reports, and the batch at which it stops paying (the speedup falls below 1
for good, interpolated in log(batch) as ``hetspec compare --sweep batch=...`` does:
``policies.runs.metrics.stops_paying``) within ``CROSSOVER_FACTOR`` of the
measured one, where the source reports one.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.runs.metrics import stops_paying

SERIES_GOAL = 0.20  # |error| of a held-out speculative speedup at each batch
CROSSOVER_FACTOR = 2.0  # the predicted crossover batch within this factor of the measured


@dataclass(frozen=True)
class Series:
    source_id: str
    name: str
    ids: tuple[str, ...]
    batches: tuple[int, ...]
    measured: tuple[float, ...]
    predicted: tuple[float, ...]

    @property
    def errors(self) -> tuple[float, ...]:
        return tuple(p / m - 1 for p, m in zip(self.predicted, self.measured))

    @property
    def within(self) -> bool:
        """Within SERIES_GOAL at every batch."""
        return all(abs(e) <= SERIES_GOAL for e in self.errors)

    @property
    def measured_crossover(self) -> float | None:
        """The batch where the measured speedup crosses 1 (None: it pays throughout)."""
        return _crossing(self.batches, self.measured)

    @property
    def predicted_crossover(self) -> float | None:
        return _crossing(self.batches, self.predicted)

    @property
    def crossover_verdict(self) -> str:
        """'yes' or 'no' (both within the series, or one within and the other past its
        largest batch by more than the factor allows), 'none' (neither crosses),
        'open' (one crosses and the other may still, past the largest batch)."""
        got, want = self.predicted_crossover, self.measured_crossover
        if got is None and want is None:
            return "none"
        if got is not None and want is not None:
            return "yes" if 1 / CROSSOVER_FACTOR <= got / want <= CROSSOVER_FACTOR else "no"
        crossed = got if got is not None else want
        return "no" if crossed * CROSSOVER_FACTOR < self.batches[-1] else "open"


def _crossing(batches, speedups) -> float | None:
    stops, _, estimate = stops_paying(list(batches), list(speedups))
    if stops is None:
        return None
    return estimate if estimate is not None else float(stops)  # below 1 from the first


def series_of(rows, simulated: dict[str, float]) -> list[Series]:
    """Every series of speedup rows at more than one batch, sorted by source and name."""
    groups: dict[tuple[str, str], list] = {}
    for r in rows:
        if r.series is not None and r.measure == "speedup":
            groups.setdefault((r.source_id, r.series), []).append(r)
    out = []
    for (sid, name), mine in sorted(groups.items()):
        mine.sort(key=lambda r: r.batch)
        if len({r.batch for r in mine}) != len(mine):
            raise ValueError(f"series {name} of source {sid} has two rows at one batch; "
                             "give each curve its own series name")
        if len(mine) < 2:
            continue
        out.append(Series(sid, name, tuple(r.id for r in mine), tuple(r.batch for r in mine),
                          tuple(r.published for r in mine),
                          tuple(simulated[r.id] for r in mine)))
    return out
