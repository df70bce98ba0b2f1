"""A section of the comparison report: a title, its figures and its notes. The
report (``report``) and the views it gathers (``sidebyside``) build them."""

from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go


@dataclass
class Section:
    title: str
    figures: list[tuple[str, go.Figure]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
