"""Timings are data: one record per request and stage, measured on the receiver's clock.

A stage is one of ``encode`` (A), ``a_to_b`` (B receiving A's payload), ``denoise`` (B), ``b_to_a`` (A receiving
B's latents) and ``decode`` (A). A transfer record splits its time into ``producer_wait_s`` (the producer had not
finished yet), ``fetch_s`` (bytes moving into the receiver's object store) and ``materialize_s`` (turning the
received buffers into tensors). Records carry the request id, the machine role and node, wall-clock start/end
(``time.time()``) on the receiver's clock, payload bytes per field and, for denoise, the per-step times. Records
measured on B carry ``clock_offset_s`` (B's clock minus A's, estimated by the executor from a round trip), so a
timeline can put both machines on A's time axis.
"""
from __future__ import annotations

import csv
import io
import threading
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Iterable

STAGES = ("encode", "a_to_b", "denoise", "b_to_a", "decode")
CSV_FIELDS = ("request_id", "stage", "machine", "node", "start", "end", "producer_wait_s", "fetch_s",
              "materialize_s", "validate_s", "serialize_s", "compute_s", "bytes", "steps", "load_s", "note",
              "clock_offset_s")


@dataclass(frozen=True)
class StepRecord:
    """One denoise step as B timed it: ``index`` of ``total`` model evaluations, its seconds. ``request_id`` is set
    where the step events reach A (B's own records of a request need none). ``preview``: B's
    :class:`~.wire.Preview` of its estimate after this step, when one was made (it is not part of the timing).
    ``restart``: not a step but the request starting over (``index`` -1, so a bar at ``index + 1`` shows 0), the
    sentence saying why (``rank A lost at step 6: re-running on B``)."""

    index: int
    total: int
    seconds: float
    request_id: str = ""
    preview: object = field(default=None, compare=False, repr=False)
    restart: str = ""


@dataclass(frozen=True)
class StageRecord:
    request_id: str
    stage: str
    machine: str
    node: str
    start: float
    end: float
    producer_wait_s: float = 0.0
    fetch_s: float = 0.0
    materialize_s: float = 0.0
    validate_s: float = 0.0
    serialize_s: float = 0.0
    compute_s: float = 0.0
    bytes: dict = field(default_factory=dict)
    steps: tuple = ()
    load_s: float = 0.0
    note: str = ""
    clock_offset_s: float = 0.0  # the measuring machine's clock minus A's (estimated); 0 on A
    info: dict = field(default_factory=dict)  # what really ran (B's denoise: model, partition, dtype, attention)

    @property
    def total_bytes(self) -> int:
        return int(sum(self.bytes.values()))

    @property
    def receive_s(self) -> float:
        """Fetch plus materialisation: what the hand-off cost once the producer was done."""
        return self.fetch_s + self.materialize_s

    def to_dict(self) -> dict:
        d = asdict(self)
        d["steps"] = list(self.steps)
        d["receive_s"] = self.receive_s
        d["total_bytes"] = self.total_bytes
        return d


class TimingLog:
    """A bounded, thread-safe store of recent records, exportable as JSON-able dicts or CSV."""

    def __init__(self, maxlen: int = 2000):
        self._records: deque[StageRecord] = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def add(self, records: Iterable[StageRecord]) -> None:
        with self._lock:
            self._records.extend(records)

    def records(self, request_id: str | None = None) -> list[StageRecord]:
        with self._lock:
            recs = list(self._records)
        return [r for r in recs if request_id is None or r.request_id == request_id]

    def to_json(self, request_id: str | None = None) -> list[dict]:
        return [r.to_dict() for r in self.records(request_id)]

    def to_csv(self, request_id: str | None = None) -> str:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(CSV_FIELDS)
        for r in self.records(request_id):
            d = r.to_dict()
            d["bytes"] = ";".join(f"{k}={v}" for k, v in r.bytes.items())
            d["steps"] = ";".join(f"{s:.6f}" for s in r.steps)
            w.writerow([d[k] for k in CSV_FIELDS])
        return buf.getvalue()


def is_extra_rank(record: StageRecord) -> bool:
    """A denoise record of a DiT group's rank other than 0 (the request's own denoise is rank 0's)."""
    return record.stage == "denoise" and int((record.info or {}).get("rank") or 0) > 0


def summarize(records: Iterable[StageRecord]) -> dict[str, float]:
    """Seconds per stage for one request: compute for encode/denoise/decode, receive for the hand-offs (a DiT
    group's denoise counts once: rank 0's)."""
    out: dict[str, float] = {}
    for r in records:
        if is_extra_rank(r):
            continue
        if r.stage in ("a_to_b", "b_to_a"):
            out[r.stage] = out.get(r.stage, 0.0) + r.receive_s
        else:
            out[r.stage] = out.get(r.stage, 0.0) + r.compute_s
    return out
