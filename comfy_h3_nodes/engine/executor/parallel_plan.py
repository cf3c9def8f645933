"""``parallel`` = ``auto``: per request, whether A's DiT rank joins B's denoise or A keeps to its encodes and decodes
while B denoises (pipelining), from measured times.

Inputs: the request's canvas and steps, how many requests of this caller are in flight (the queue A's work could
overlap with), A's measured seconds of work per request (encode + decode, from its records) and the measured seconds
per step on one rank and on a group of each size (:class:`StepClock`, fed by every denoise record). Until a group
size is measured it is assumed to take ``1 / (ASSUMED_EFFICIENCY x ranks)`` of one rank's step, and the note says so.

The model, for ``k`` requests (this one and ``k - 1`` in flight) of A work ``a`` and denoise ``d1`` (one rank) or
``dg`` (the group): pipelined, A and B overlap: ``a + d1 + (k - 1) x max(a, d1)``; joined, A's rank is busy during
every denoise, so A's own work no longer overlaps it: ``k x (a + dg)``. The smaller finishes the queue sooner.
"""

from __future__ import annotations

from dataclasses import dataclass

ASSUMED_EFFICIENCY = 0.85
ALPHA = 0.5


class StepClock:
    """Measured seconds per step, per (height, width, frames) and number of ranks, as moving averages; another canvas
    of the same rank count is scaled by its packed rows."""

    def __init__(self):
        self.step_s: dict[tuple, float] = {}

    def add(self, shape: tuple, ranks: int, steps: list[float]) -> None:
        if not steps or shape is None:
            return
        median = sorted(steps)[len(steps) // 2]
        key = (*shape, ranks)
        old = self.step_s.get(key)
        self.step_s[key] = median if old is None else (1 - ALPHA) * old + ALPHA * median

    def get(self, shape: tuple, ranks: int) -> float | None:
        exact = self.step_s.get((*shape, ranks))
        if exact is not None:
            return exact
        near = [(k, v) for k, v in self.step_s.items() if k[3] == ranks]
        if not near:
            return None
        (h, w, f, _), v = near[-1]
        return v * (shape[0] * shape[1] * shape[2]) / max(h * w * f, 1)


@dataclass
class Choice:
    join: bool
    why: str


def choose(clock: StepClock, shape: tuple | None, steps: int, ranks: int, in_flight: int,
           a_work_s: float | None) -> Choice:
    """Whether a group of ``ranks`` (A's rank and B's) finishes the queue sooner than one worker, and why."""
    forwards = max(steps - 1, 1)
    one = clock.get(shape, 1) if shape else None
    if one is None:
        return Choice(False, "parallel auto: one worker (one rank's step time is not measured yet: this request "
                      "measures it)")
    group = clock.get(shape, ranks)
    assumed = group is None
    if assumed:
        group = one / (ASSUMED_EFFICIENCY * ranks)
    a = a_work_s or 0.0
    d1, dg, k = one * forwards, group * forwards, max(in_flight, 1)
    pipelined = a + d1 + (k - 1) * max(a, d1)
    joined = k * (a + dg)
    how = (f"{k} request(s) in flight, A {a:.2f} s each, denoise {d1:.2f} s on one rank vs {dg:.2f} s on {ranks}"
           f"{' (assumed)' if assumed else ''}: joined {joined:.2f} s vs pipelined {pipelined:.2f} s")
    if joined < pipelined:
        return Choice(True, f"parallel auto: A joins B, {how}")
    return Choice(False, f"parallel auto: one worker (A pipelines its encodes and decodes beside it), {how}")
