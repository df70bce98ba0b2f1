"""The discrete-event engine: resources, roofline costs, spans. It knows
operations and hardware, nothing about speculative decoding; where a simulated
Verify or Outcome needs an answer, ``outcomes`` draws it from an acceptance model
(``acceptance``) and the schedule's outcome models (``policies.base``)."""

from policies.runs.files import Span, chrome_trace, write_chrome_trace
from simcore.costmodel import CostError, ForwardCost, RooflineCost
from simcore.engine import SimResult, Simulator
from simcore.outcomes import Outcomes

__all__ = ["CostError", "ForwardCost", "Outcomes", "RooflineCost", "SimResult", "Simulator",
           "Span", "chrome_trace", "write_chrome_trace"]
