"""Where one request's video is decoded: by A alone, or split with B (B decodes the last clips from the latents it
still holds, A the rest and blends them in; :mod:`..model.split_decode` makes that bit-identical).

Inputs of a plan: the canvas, A's decoder facts (its dtype, weights fingerprint and clip geometry), B's (from its
health), how much work B still has queued for this client, the caller's choice (``auto``, ``A``, ``A+B``) and each
side's measured seconds per clip (:class:`ClipClock`, fed by :meth:`DecodePlanner.learn` from the decode records).
Output: a :class:`DecodePlan` whose ``why`` is the sentence every decode record carries.

The share (:func:`choose_b_clips`, in spatial tiles: the shares may meet inside a clip, so neither side waits a whole
clip for the other; 832x480 is 12 tiles per clip, 640x384 6): B decodes the last ``k`` tiles, A the first ones and then
blends, so A's own clips never wait for B's; ``k`` minimises the predicted finish ``max(A's clips, B's clips - B's lead
+ fetching B's frames)`` (A pulls B's frames while it still decodes its own: only a B that ends after A makes A wait for
them): a slower side gets fewer clips.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..contract import wire
from ..contract.configs import DECODE_ON
from ..contract.timing import StageRecord
from ..model import split_decode as sd


@dataclass
class DecodePlan:
    """How one request's video is decoded: by A alone, or split with B decoding clips ``[b_start, clips)``."""

    mode: str  # "A" | "A+B"
    clips: int
    b_start: int
    why: str
    decode_on: str = "auto"
    #: where the shares meet inside clip ``b_start``: B decodes its tiles from this one on, A the ones before (0: B
    #: takes the whole clip)
    b_tile: int = 0
    #: spatial tiles per clip (the unit the shares are balanced in)
    tiles: int = 1


def choose_b_clips(n: int, a_clip_s: float, b_clip_s: float, b_lead_s: float = 0.0,
                   fetch_clip_s: float = 0.0) -> int:
    """How many of the ``n`` clips B decodes (the last ones): the ``k`` with the earliest predicted end of the
    clips, :func:`predicted_s`; ties go to fewer B clips."""
    best_k, best_t = 0, float("inf")
    for k in range(n + 1):
        t = predicted_s(n, k, a_clip_s, b_clip_s, b_lead_s, fetch_clip_s)
        if t < best_t - 1e-12:
            best_k, best_t = k, t
    return best_k


def predicted_s(n: int, k: int, a_clip_s: float, b_clip_s: float, b_lead_s: float = 0.0,
                fetch_clip_s: float = 0.0) -> float:
    """When A holds every clip: its own ``n - k``, and B's ``k`` once B decoded them and they crossed (A pulls them
    while it decodes its own, so the crossing costs A time only when B ends after A)."""
    return max((n - k) * a_clip_s, k * b_clip_s - b_lead_s + k * fetch_clip_s)


class ClipClock:
    """Each side's measured seconds per clip, per megapixel of canvas (a clip's cost grows with its tiles), as an
    exponential moving average; and the seconds per clip B's frames took to reach A. A's clips are timed apart when
    A decodes alone (``A alone``: what a split must beat) and inside a split (``A``: what the shares balance; on a
    machine where both sides share CPUs or memory bandwidth, slower than alone)."""

    def __init__(self, alpha: float = 0.5):
        self.alpha = alpha
        self.per_mpx: dict[str, float] = {}
        self.fetch_per_mpx: float | None = None

    def _ema(self, old, new):
        return new if old is None else (1 - self.alpha) * old + self.alpha * new

    def add(self, side: str, clips: float, seconds: float, height: int, width: int) -> None:
        if clips > 0 and seconds > 0:
            mpx = height * width / 1e6
            self.per_mpx[side] = self._ema(self.per_mpx.get(side), seconds / clips / mpx)

    def add_fetch(self, clips: float, seconds: float, height: int, width: int) -> None:
        if clips > 0:
            self.fetch_per_mpx = self._ema(self.fetch_per_mpx, seconds / clips / (height * width / 1e6))

    def clip_s(self, side: str, height: int, width: int) -> float | None:
        """``side`` is ``A`` (A's clips in split decodes, falling back to ``A alone``), ``A alone`` or ``B``."""
        v = self.per_mpx.get(side)
        if v is None and side == "A":
            v = self.per_mpx.get("A alone")
        return None if v is None else v * height * width / 1e6

    def fetch_clip_s(self, height: int, width: int) -> float:
        return 0.0 if self.fetch_per_mpx is None else self.fetch_per_mpx * height * width / 1e6


class DecodePlanner:
    """The decode policy of one executor: its default choice, the shortest decode worth splitting and the clock."""

    def __init__(self, decode_on: str = "auto", min_split_s: float = 1.0):
        if decode_on not in DECODE_ON:
            raise ValueError(f"decode_on is {decode_on!r}; expected one of {DECODE_ON}.")
        self.decode_on, self.min_split_s = decode_on, min_split_s
        self.clock = ClipClock()

    def plan(self, height: int, width: int, num_frames: int, a: dict, b: dict | None, b_queue: int = 0,
             decode_on: str | None = None, b_clips: int | None = None) -> DecodePlan:
        """``a``/``b``: each side's decoder facts (``decoder_info()``; B's from its health, None when unknown).
        ``b_clips`` forces B's share (tests, benchmarks); otherwise it follows the measured clip times."""
        choice = decode_on or self.decode_on
        if choice not in DECODE_ON:
            raise ValueError(f"decode_on is {choice!r}; expected one of {DECODE_ON}.")
        n = sd.clips_for(a, wire.video_latent_frames(num_frames))

        def alone(why: str) -> DecodePlan:
            return DecodePlan("A", n, n, why, choice)

        if choice == "A":
            return alone("decode_on 'A'")
        b = b or {}
        if not b.get("resident"):
            return alone(f"B holds no video VAE ({b.get('note') or 'this B does not say'})")
        if b.get("dtype") != a["dtype"] or b.get("fingerprint") != a["fingerprint"]:
            return alone(f"B's video VAE ({b.get('dtype')}, weights {b.get('fingerprint')}) is not A's "
                         f"({a['dtype']}, weights {a['fingerprint']}): the frames would differ")
        if b.get("tiling") != a.get("tiling"):
            return alone(f"B's video VAE tiles its clips as {b.get('tiling')}, A's as {a.get('tiling')}: the frames "
                         "would differ")
        clock = self.clock
        alone_s = clock.clip_s("A alone", height, width) or clock.clip_s("A", height, width)
        if choice == "auto":
            if b_queue:
                return alone(f"B has {b_queue} more request(s) waiting: A decodes alone")
            if alone_s is None:
                return alone("A's seconds per clip are not measured yet (this decode measures them)")
            if n * alone_s < self.min_split_s:
                return alone(f"A alone takes about {n * alone_s:.2f} s, under the {self.min_split_s:g} s worth "
                             "splitting")
        a_s = clock.clip_s("A", height, width) or 1.0
        b_s = clock.clip_s("B", height, width) or a_s  # unmeasured: as fast as A (two equal machines)
        fetch = clock.fetch_clip_s(height, width)
        if b_clips is not None:  # forced: whole clips
            k = max(0, min(int(b_clips), n))
            if k == 0:
                return alone("B's share was set to no clip")
            return DecodePlan("A+B", n, n - k, f"B decodes clips {n - k}-{n - 1} of {n} (forced)", choice)
        # balanced in tiles: the shares meet inside a clip (B the last k of its n x tiles tiles), so neither side
        # waits a whole clip for the other
        t = sd.tiles_for(a, height, width)
        k = choose_b_clips(n * t, a_s / t, b_s / t, 0.0, fetch / t)
        if k == 0:
            return alone(f"the measured clip times give B no clip (A {a_s:.3f} s, B {b_s:.3f} s, "
                         f"fetch {fetch:.3f} s per clip)")
        b_start, b_tile = n - -(-k // t), -(-k // t) * t - k
        why = (f"B decodes clips {b_start}-{n - 1} of {n}"
               + (f" (clip {b_start} from tile {b_tile} of {t})" if b_tile else "")
               + f": A {a_s:.3f} s, B {b_s:.3f} s, fetch {fetch:.3f} s per clip, predicted "
               f"{predicted_s(n * t, k, a_s / t, b_s / t, 0.0, fetch / t):.2f} s vs {n * (alone_s or a_s):.2f} s on "
               "A alone")
        return DecodePlan("A+B", n, b_start, why, choice, b_tile, t)

    def learn(self, records: list[StageRecord], height: int, width: int, clips: int) -> None:
        """Feed each side's measured seconds per clip (and B's frames' fetch per clip) to the clock."""
        for r in records:
            if r.stage != "decode":
                continue
            info = r.info or {}
            # a clip the shares met in counts as the part of its tiles each side decoded
            t = max(int(info.get("tiles") or 1), 1)
            if r.machine == "B":
                first = int(info.get("first_tile") or 0)
                self.clock.add("B", len(info.get("clip_s", ())) - first / t, sum(info.get("clip_s", ())), height,
                               width)
            elif info.get("decode_on") == "A+B":
                b0, b_tile = info["a_clips"][1], int(info.get("b_tile") or 0)
                own = [(s, 1.0 if i < b0 else b_tile / t) for i, s in zip(info["a_decoded"], info["a_clip_s"])
                       if i < b0 or (i == b0 and b_tile)]
                self.clock.add("A", sum(c for _, c in own), sum(s for s, _ in own), height, width)
                got = len(info.get("b_received", ()))
                if got:
                    self.clock.add_fetch(got - b_tile / t if b_tile else got, r.fetch_s + r.materialize_s, height,
                                         width)
            else:
                self.clock.add("A alone", clips, r.compute_s, height, width)


def alone_record(rec: StageRecord, plan: DecodePlan) -> StageRecord:
    """A's decode record of a decode by A alone: what ran and why (when the caller did not ask for A alone)."""
    note = "; ".join(x for x in (rec.note, "" if plan.decode_on == "A" else f"A decoded alone: {plan.why}") if x)
    return dataclasses.replace(rec, note=note, info={**(rec.info or {}), "decode_on": "A", "clips": plan.clips,
                                                     "why": plan.why})
