"""Batches: N jobs of one graph run, denoised while A encodes the next and decoded in order as they come back.

A ComfyUI graph run that carries N prompts runs each H3 node once over the whole list; the nodes hand each other
jobs in flight, not finished results. :class:`Batch` is what the jobs of one ``H3RemoteDenoise`` call share (one
progress counter, one stop), and :func:`decode_in_order` is ``H3Decode``'s loop: each job's latents awaited
(bounded, the host's interrupt polled), decoded, reported; a failed job is named and the others still decode.
"""

from __future__ import annotations

from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import Callable

from ..contract.errors import H3Cancelled
from .pipeline import BatchProgress, Job


@dataclass(eq=False)  # identity: the jobs of one batch share it
class Batch:
    jobs: list[Job]
    progress: BatchProgress

    def cancel(self) -> None:
        """Stop every request of the batch: queued encodes never start, B stops each before its next step."""
        for job in self.jobs:
            job.cancel()

    def on_step(self, ev) -> None:
        self.progress.step(ev.request_id, ev.index)


@dataclass
class Outcome:
    """What a batch decode gave: ``done`` ``(job, decoded)`` in prompt order, ``failed`` ``(job, why)``."""

    done: list = field(default_factory=list)
    failed: list = field(default_factory=list)


def decode_in_order(items: list, decode: Callable[[object], object], should_cancel: Callable[[], bool],
                    on_progress: Callable[[int, int], None] | None = None) -> Outcome:
    """Decode ``items`` (jobs, or already received latents) in order with ``decode(item)``, each job as soon as its
    latents are on A. ``should_cancel`` (the host's interrupt) stops every batch involved and raises
    :class:`H3Cancelled`; any other failure of a job is kept in ``failed`` and the rest go on."""
    batches = list(dict.fromkeys(getattr(x, "batch", None) for x in items if getattr(x, "batch", None)))
    total = sum(b.progress.total for b in batches)
    out = Outcome()

    def progress():
        if on_progress is not None and total:
            on_progress(sum(b.progress.value for b in batches), total)

    def poll() -> bool:  # while a job's latents are awaited: the bar follows B's steps, the interrupt is checked
        progress()
        return should_cancel()

    try:
        for item in items:
            if isinstance(item, Job):
                try:
                    item.result(should_cancel=poll)
                except H3Cancelled:
                    if should_cancel():
                        raise
                    out.failed.append((item, "cancelled"))
                    continue
                except CancelledError:
                    out.failed.append((item, "cancelled"))
                    continue
                except Exception as exc:  # noqa: BLE001 - named with its request by the caller
                    out.failed.append((item, str(exc)))
                    continue
            out.done.append((item, decode(item)))
            if getattr(item, "batch", None) is not None:
                item.batch.progress.decoded()
            progress()
    except BaseException:
        for b in batches:
            b.cancel()
        raise
    return out
