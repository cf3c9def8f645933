"""A's client of B's per-forward calls: ComfyUI's own sampler on A, the DiT's forwards on B.

A sampler calls the model once or twice a step (CFG). Per sampling run A opens one :class:`RemoteSampling` on one
DiT worker; per conditioning it puts one :class:`~..contract.ForwardContext` in its object store (text states,
the packed layout, the guide and reference rows) and sends that object's reference with every forward, so B fetches
it once and keeps it by id; per forward only the target rows cross A->B, and their model output B->A.

Every wait is bounded: a forward waits at most ``forward_timeout`` seconds, in slices of ``poll`` seconds, between
which the caller's ``interrupted`` is asked (ComfyUI's Cancel): then B is told to stop (it stops before its next
transformer block) and :class:`~..contract.errors.H3Cancelled` is raised. A worker lost mid-sampling raises
:class:`~..contract.errors.H3Error` at once with the forward named; the next sampling picks a worker again. A forward
B has not answered for ``link.LINK_SILENT_S`` has B's node probed (:class:`~.link.LinkProbe`: a TCP connect to its
raylet): a link that carries nothing (a QSFP cable pulled) or a host whose processes are gone ends the sampling in
one sentence within seconds, B told to stop that forward when its link is back (never waited for), so a sampler
never waits out the stall bound on a cut link while B keeps its model through the head's partition tolerance.

With a DiT group (``parallel`` A+B or all: ``group``, A's rank first) every forward goes to every rank with its place
in the group (:class:`~..contract.wire.ParallelCall`); they run it together under context parallelism, and rank 0's
output (A's own rank: read from A's own store) is the forward's. A rank lost mid-sampling: the ranks left drop the
group and the forward runs again, with the same rows, on one of them (a B worker when one is left), and so do the
forwards after it; the readout says so.

One :class:`ForwardRecord` per forward, on the receiver's clock for each hand-off: A->B is B's arrival minus A's
send (B's clock, corrected by the measured offset), B->A is A's receipt minus the end of the forward's output rank;
:meth:`RemoteSampling.summary` adds them up for the readout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Callable

import ray
import torch

from ..contract import wire
from ..contract.forward_payloads import ForwardCall, ForwardContext
from ..contract.errors import H3Cancelled, H3Error, H3Timeout
from .failures import first_line, remote_error
from .link import LinkProbe

log = logging.getLogger("comfy_h3.remote_forward")
_ids = itertools.count()


@dataclass(frozen=True)
class ForwardRecord:
    """One forward as the two machines saw it (seconds)."""

    index: int
    round_trip_s: float  # A's send to A's receipt of the result
    compute_s: float     # B's forward (a group's: its B rank's)
    a_to_b_s: float      # B's arrival minus A's send (on B's clock, offset-corrected)
    b_to_a_s: float      # A's receipt minus B's end
    bytes_a_to_b: int
    bytes_b_to_a: int
    context_s: float = 0.0  # the first forward of a context: B's fetch of it
    ranks_compute_s: tuple = ()  # a DiT group's forward: each rank's compute, rank 0 first


@dataclass
class RemoteSampling:
    """The forwards of one sampler run on one DiT worker (``handle``, named ``worker``)."""

    handle: object
    worker: str
    clock_offset_s: float = 0.0  # B's clock minus A's
    forward_timeout: float = 600.0
    poll: float = 0.1
    sampling_id: str = field(default_factory=lambda: f"s{next(_ids)}-{uuid.uuid4().hex[:8]}")
    records: list[ForwardRecord] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    _contexts: dict = field(default_factory=dict)
    lora_ref: object = None  # the sampling's LoRA patch set (ComfyLoraSet), put once; None: no LoRA
    lora_modules: int = 0  # how many of B's modules it patched (B's answer)
    #: machine -> seconds a worker spent loading its model again (released by "Release B's model" or /free)
    reloaded_s: dict = field(default_factory=dict)
    lora_bytes_fetched: int = 0  # what B fetched of it for this sampling (0: B had it from an earlier one)
    group: object = None  # a DiTGroup (parallel): every forward runs on all its ranks, rank 0's output is kept
    on_lost: Callable | None = None  # told the ranks lost mid-sampling (the caller drops its group)
    rerun: str = ""  # what a lost rank changed (the readout says so)
    machine: str = "B"  # where ``handle`` runs (A: A's DiT rank, left alone by a lost B)
    ran_on: dict | None = None  # the group the sampling started on (its method and ranks), for the readout
    b_note: str = ""  # what the check at the sampling's start found changed on B (restarted, released)
    #: B's node as the pool saw it (``node_id``, ``node_ip``): probed when a forward gets no answer for a while
    node_id: str | None = None
    node_ip: str = ""

    def context_ref(self, key: tuple, make: Callable[[], ForwardContext], keep=None):
        """The object reference of the context ``key`` names (``make`` builds it the first time): put once per
        sampling and conditioning, so B fetches it once. ``keep`` (what an ``id`` in the key names) stays referenced
        with it, so that id names nothing else while the sampling runs."""
        hit = self._contexts.get(key)
        if hit is None:
            ctx = make()
            ctx.validate()
            hit = self._contexts[key] = (ray.put(ctx), keep)
        return hit[0]

    def forward(self, ctx_ref, video, audio, timestep, timestep_indices,
                interrupted: Callable[[], bool] = lambda: False) -> tuple:
        """One forward: ``video`` / ``audio`` the target rows (float32 torch), ``timestep`` the distinct values,
        ``timestep_indices`` per row of the sequence. Returns B's ``(video, audio)`` output rows (torch)."""
        index = len(self.records)
        call = ForwardCall(self.sampling_id, index, wire.WireTensor.from_torch(video),
                           wire.WireTensor.from_torch(audio), wire.WireTensor.from_torch(timestep),
                           wire.WireTensor.from_torch(timestep_indices))
        targets = self._targets(call)
        sent = time.time()
        refs = [ctx_ref] if self.lora_ref is None else [ctx_ref, self.lora_ref]
        pending = [h.forward.options(num_returns=2).remote(refs, c) for h, c, _, _ in targets]
        # the outputs too: one B holds until A fetches it (a cable pulled between B's end and A's fetch is waited
        # for here, in slices, with the link probed; never in an unsliced get)
        refs_all = [r for pair in pending for r in pair]
        deadline = time.monotonic() + self.forward_timeout
        while True:  # every rank ends: a lost rank breaks its peers' next collective within the group's timeout
            ready, _ = ray.wait(refs_all, num_returns=len(refs_all), timeout=self.poll, fetch_local=True)
            if len(ready) == len(refs_all):
                break
            if interrupted():
                self.cancel()
                raise H3Cancelled(f"sampling {self.sampling_id} was interrupted at forward {index + 1}; B stopped "
                                  "it between two transformer blocks.")
            self._probe_link(index, sent)
            if time.monotonic() > deadline:
                self.cancel()
                raise H3Timeout(f"B's worker {self.worker} took over {self.forward_timeout:.0f} s for forward "
                                f"{index + 1} of sampling {self.sampling_id}; check B's health (python -m "
                                "remote_worker status) or raise the forward timeout.")
        answers, errors = [], []
        for i, (result_ref, info_ref) in enumerate(pending):
            try:
                answers.append(ray.get([result_ref, info_ref], timeout=self.forward_timeout))
            except ray.exceptions.RayError as exc:
                errors.append((i, exc))
        if errors and self.group is not None:
            self._rank_failed(errors, index)  # raises, or leaves one rank to run this forward again
            return self.forward(ctx_ref, video, audio, timestep, timestep_indices, interrupted)
        if errors:
            err = remote_error("B", f"forward {index + 1} of ComfyUI's sampler", self.sampling_id, errors[0][1])
            if isinstance(err, H3Cancelled):
                raise err from None
            probes = self._probes()  # a host lost: the head counts its node alive for up to 150 s; its node is asked
            if probes and probes[0].refused():
                probes[0].stage = f"forward {index + 1} of ComfyUI's sampler"
                raise probes[0].lost_error(self.sampling_id) from None
            said = str(err).removesuffix(": run the request again.").rstrip(".")  # said once, below
            raise H3Error(f"{said}. The sampler on A stopped at forward {index + 1}; queue the prompt again: the "
                          "next sampling picks a DiT worker that answers.") from None
        got = time.time()
        result, info = answers[0]  # rank 0's output is the forward's
        result.validate(call)
        # the hand-off that crossed machines: a B rank's receipt (A's rank reads A's own store)
        b_side = next((j for j, t in enumerate(targets) if t[3] == "B"), 0)
        crossed, offset = answers[b_side][1], targets[b_side][2]
        self.lora_modules = info.get("lora_modules", 0)
        self.lora_bytes_fetched += crossed.get("lora_bytes", 0)
        for target, (_, said) in zip(targets, answers):  # a released worker loaded its model for this forward
            if said.get("reloaded_after_release_s"):
                self.reloaded_s[target[3]] = round(self.reloaded_s.get(target[3], 0.0)
                                                   + said["reloaded_after_release_s"], 4)
        arrived = crossed["arrived"] - offset
        ended = info["ended"] - targets[0][2]
        self.records.append(ForwardRecord(
            index, round(got - sent, 6), round(crossed["compute_s"], 6), round(max(arrived - sent, 0.0), 6),
            round(max(got - ended, 0.0), 6), call.nbytes, result.nbytes, crossed.get("context_fetch_s", 0.0),
            tuple(round(a[1]["compute_s"], 6) for a in answers) if self.group is not None else ()))
        return result.video.to_torch(), result.audio.to_torch()

    def _probes(self) -> list[LinkProbe]:
        """One probe per B node this sampling's forwards go to (A's own rank needs none)."""
        if self.group is None:
            nodes = [(self.node_id, self.node_ip)] if self.machine == "B" and self.node_ip not in ("", "?") else []
        else:
            nodes = [(None, r.node_ip) for r in self.group.ranks if r.machine == "B" and r.node_ip]
        key = tuple(nodes)
        if getattr(self, "_probe_key", None) != key:
            self._probe_key, self._probe_list = key, [LinkProbe(i, ip, "ComfyUI's sampler") for i, ip in nodes]
        return self._probe_list

    def _probe_link(self, index: int, sent: float) -> None:
        """A forward unanswered for a while: B's node probed (every few seconds); a cut link or a lost host raises
        the probe's one sentence, B told to stop (delivered when its link is back; nothing waits for it)."""
        silent = time.time() - sent
        for probe in self._probes():
            if not probe.due(silent):
                continue
            probe.stage = f"forward {index + 1} of ComfyUI's sampler"
            try:
                probe.check(self.sampling_id, silent)
            except H3Error:
                handles = [r.handle for r in self.group.ranks] if self.group is not None else [self.handle]
                for h in handles:
                    try:
                        h.cancel.remote(self.sampling_id)
                    except Exception:  # noqa: BLE001 - a handle Ray no longer serves
                        pass
                if self.group is not None:  # a group with a silent rank is never used again
                    lost = [r for r in self.group.ranks if r.node_ip == probe.node_ip]
                    self.group = None
                    if self.on_lost is not None:
                        self.on_lost(lost)
                raise

    def _targets(self, call: ForwardCall) -> list[tuple]:
        """``(handle, call, clock offset, machine)`` per rank: one worker's, or every rank of the group with its
        place in it."""
        if self.group is None:
            return [(self.handle, call, self.clock_offset_s, self.machine)]
        g = self.group
        return [(r.handle, dataclasses.replace(call, parallel=wire.ParallelCall(g.group_id, i, len(g.ranks), g.method)),
                 self.clock_offset_s if r.machine == "B" else 0.0, r.machine) for i, r in enumerate(g.ranks)]

    def _rank_failed(self, errors: list, index: int) -> None:
        """A forward of the group failed on ``errors``' ranks: a cancel is raised as such; a rank that no longer
        answers is dropped with the group, and one rank left takes the forward (and the rest of the sampling) on
        its own; any other failure is one sentence naming the rank."""
        g = self.group
        stage = f"forward {index + 1} of ComfyUI's sampler"
        said = [(g.ranks[i], remote_error(g.ranks[i].machine, stage, self.sampling_id, e)) for i, e in errors]
        if all(isinstance(e, H3Cancelled) for _, e in said):
            raise said[0][1] from None
        alive = []
        for r in g.ranks:
            try:
                ray.get(r.handle.ping.remote(), timeout=5.0)
                alive.append(r)
            except Exception:  # noqa: BLE001 - the rank that was lost
                pass
        lost = [r for r in g.ranks if r not in alive]
        self.group = None  # a broken group is never used again
        for r in alive:
            try:
                ray.get(r.handle.leave_group.remote(g.group_id), timeout=5.0)
            except Exception:  # noqa: BLE001 - it left already, or stopped answering since
                pass
        if self.on_lost is not None:
            self.on_lost(lost)
        if not lost or not alive:
            r, err = said[0]
            raise H3Error(f"{r.machine}'s DiT rank {r.name} failed in the DiT group at {stage}: {first_line(err)} The "
                          f"sampler on A stopped at forward {index + 1}; queue the prompt again.") from None
        survivor = next((r for r in alive if r.machine == "B"), alive[0])
        self.handle, self.worker, self.machine = survivor.handle, survivor.name, survivor.machine
        if survivor.machine != "B":
            self.clock_offset_s = 0.0
        names = " + ".join(f"{r.machine}'s rank {r.name}" for r in lost)
        self.rerun = (f"{names} lost at forward {index + 1}: that forward and the rest ran again on "
                      f"{survivor.machine} {survivor.name} alone")
        log.warning("[%s] %s", self.sampling_id, self.rerun)

    def cancel(self) -> None:
        handles = [r.handle for r in self.group.ranks] if self.group is not None else [self.handle]
        try:  # every rank: a group's ranks agree before each block and stop at the same one
            ray.get([h.cancel.remote(self.sampling_id) for h in handles], timeout=10.0)
        except Exception:  # noqa: BLE001 - the worker is gone or slow: the caller reports the interrupt anyway
            pass

    def summary(self) -> dict:
        """The readout's figures: forwards, B's compute and both hand-offs, per forward and in all."""
        n = len(self.records)
        tot = {k: round(sum(getattr(r, k) for r in self.records), 6)
               for k in ("round_trip_s", "compute_s", "a_to_b_s", "b_to_a_s", "bytes_a_to_b", "bytes_b_to_a")}
        per = {k: round(v / n, 6) for k, v in tot.items()} if n else {}
        return {"sampling_id": self.sampling_id, "worker": self.worker, "forwards": n, "total": tot,
                "parallel": self.ran_on, "rerun": self.rerun, "b_note": self.b_note,
                "ranks_compute_s": [round(sum(c), 6) for c in zip(*(r.ranks_compute_s for r in self.records
                                                                     if r.ranks_compute_s))],
                "lora_modules": self.lora_modules, "lora_bytes_fetched": self.lora_bytes_fetched,
                "reloaded_s": dict(self.reloaded_s),
                "per_forward": per, "started": self.started, "wall_s": round(time.time() - self.started, 6),
                "records": [asdict(r) for r in self.records]}


def fingerprint(*tensors) -> str:
    """A content key of CPU tensors (the conditioning a sampler hands each forward may be a new tensor with the same
    values: concatenated for CFG, cast, moved): the context is put once per distinct content."""
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        t = t.detach().cpu().contiguous()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # the tensor's own bytes, not a copy
    return h.hexdigest()
