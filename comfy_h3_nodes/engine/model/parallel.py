"""Sequence (context) parallelism of H3's transformer across DiT ranks, through diffusers' own implementation.

diffusers 0.42.1 splits the packed sequence of ``MiniMaxH3Transformer3DModel`` at its first block and gathers it at
its output projections (``_cp_plan``); ``enable_parallelism(config=ContextParallelConfig(...))`` installs that on a
model once ``torch.distributed`` is initialised. Every rank holds the whole model and ends with the same latents.
This module is the little a rank adds around it:

* :func:`join` / :func:`leave`: the process group of one DiT group (gloo on CPU, NCCL for tensors plus gloo for
  the per-step agreement on CUDA), its timeout always set (never the 30-minute default);
* :func:`method_for`: Ulysses when the heads divide the degree (``ulysses_anything``: any sequence length), ring
  where the backend supports it, else a refusal in one sentence;
* :func:`applied`: enable parallelism on the model for one request and undo it afterwards, so the same resident
  model serves single-rank requests in between; two fixes for diffusers 0.42.1 on CPU live here, each once:
  ``_resolve_parallel_config`` divides by ``torch.accelerator.device_count()`` (0 on CPU), and gloo refuses the
  uneven ``all_gather`` that ``ulysses_anything`` does at the output;
* :class:`CommClock`: the wall time a rank spends inside the collectives (the communication share);
* :func:`agree_stop`: one tiny all-reduce per step so every rank stops at the same step (cancel, interrupt).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import diffusers.hooks.context_parallel as cp_hooks
import diffusers.models.attention_dispatch as attention_dispatch
import torch
import torch.distributed as dist
from diffusers import ContextParallelConfig
from diffusers.hooks.context_parallel import remove_context_parallel
from torch.distributed.device_mesh import init_device_mesh

from ..contract.errors import H3Error

log = logging.getLogger("comfy_h3.parallel")

#: the methods a group may run: diffusers' Ulysses (any length) and ring
METHODS = ("ulysses", "ring")
#: backends whose forward op returns the log-sum-exp that ring attention needs (none of them runs on CPU); diffusers
#: 0.42's ``_flash_3`` does not support context parallelism, so it is not one of them
RING_BACKENDS = ("flash", "sage", "_native_cudnn", "_native_flash")


class ParallelError(H3Error):
    """A DiT group that cannot run: the message names the ranks, the value and what would work."""


def method_for(heads: int, degree: int, backend: str) -> str:
    """How ``degree`` ranks split attention of ``heads`` heads: Ulysses (diffusers' ``ulysses_anything``: any
    sequence length, and heads padded to a multiple of the degree while the padding stays under one rank's share),
    else ring where the attention backend supports it; else one sentence with the degrees that work."""
    if degree < 2:
        raise ParallelError(f"a DiT group needs at least 2 ranks; it has {degree}.")
    pad = (-heads) % degree
    if pad * degree < heads + pad:
        return "ulysses"
    if backend in RING_BACKENDS:
        return "ring"
    fits = [d for d in range(2, heads + 1) if (-heads) % d * d < heads + (-heads) % d][:4]
    raise ParallelError(
        f"the transformer's {heads} attention heads do not split over {degree} ranks for Ulysses, and attention "
        f"backend {backend!r} cannot run ring attention: use {', '.join(map(str, fits))} ranks, or a flash backend.")


# ---------------------------------------------------------------------------------------------------- group
@dataclass
class Group:
    """This process's membership of one DiT group."""

    group_id: str
    rank: int
    world: int
    timeout_s: float
    backend: str
    agree_group: object = None  # the gloo group of the per-step agreement (the default group on CPU)
    meshes: dict = field(default_factory=dict)  # method -> its device mesh, made once when the group forms
    owner: int = 0  # the thread that joined: it runs the group's collectives, and only it destroys the group
    busy: bool = False  # a request runs on it (``applied``)
    doomed: bool = False  # left from another thread while busy: the owner destroys it when the request ends


_GROUP: Group | None = None
_lock = threading.Lock()
#: rank 0's stores, each listening on the port its rendezvous named, until its join takes it (the last few kept)
_PENDING: dict[str, object] = {}
_pending_lock = threading.Lock()
#: NCCL's watchdog counts from when the CPU queues a collective, and the CPU runs layers ahead of the GPU: the data
#: collectives on CUDA get at least one forward at the largest canvas (the gloo agreement keeps the short bound)
NCCL_TIMEOUT_ENV = "H3_NCCL_TIMEOUT_S"
NCCL_TIMEOUT_FLOOR_S = 900.0


def nccl_timeout_s(timeout_s: float) -> float:
    return max(timeout_s, float(os.environ.get(NCCL_TIMEOUT_ENV, NCCL_TIMEOUT_FLOOR_S)))


def _meshes(world: int, device: str) -> dict:
    """The device meshes diffusers' context parallelism takes (``ContextParallelConfig.mesh``), one per method:
    built here once per group (else ``enable_parallelism`` builds one, and new process groups, every request)."""
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    names = ("ring", "ulysses")
    return {"ulysses": init_device_mesh(device_type, (1, world), mesh_dim_names=names),
            "ring": init_device_mesh(device_type, (world, 1), mesh_dim_names=names)}


def current() -> Group | None:
    return _GROUP


def rendezvous(host: str, join_timeout_s: float = 600.0) -> str:
    """``host:port`` where a group with this process as rank 0 meets. Its store listens from now on, on a port the OS
    gave it: a port only found free and closed again could be taken (by any process's outgoing connection) before
    the join binds it, and then the group cannot form (EADDRINUSE)."""
    store = dist.TCPStore(host, 0, None, True, timeout=datetime.timedelta(seconds=join_timeout_s),
                          wait_for_workers=False)
    address = f"{host}:{store.port}"
    with _pending_lock:
        _PENDING[address] = store
        while len(_PENDING) > 4:  # rendezvous of groups that never formed
            _PENDING.pop(next(iter(_PENDING)))
    return address


def join(group_id: str, address: str, rank: int, world: int, timeout_s: float, device: str = "cpu",
         join_timeout_s: float = 600.0) -> Group:
    """Join the group at ``address`` (``host:port``, rank 0's rendezvous; rank 0 serves it) as ``rank`` of
    ``world``. The meeting may take up to ``join_timeout_s`` (a rank may still finish another request first); every
    collective afterwards is bounded by ``timeout_s``. A previous group of this process is left first."""
    global _GROUP
    with _lock:
        if _GROUP is not None:
            leave()
        cuda = device.startswith("cuda")
        backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
        host, port = address.rsplit(":", 1)
        t0 = time.perf_counter()
        try:
            with _pending_lock:
                store = _PENDING.pop(address, None) if rank == 0 else None
            if store is not None:  # rank 0's store, listening since its rendezvous
                store.set_timeout(datetime.timedelta(seconds=join_timeout_s))
            else:
                store = dist.TCPStore(host, int(port), world, rank == 0,
                                      timeout=datetime.timedelta(seconds=join_timeout_s))
            extra = {"device_id": torch.device(device if ":" in device else "cuda:0")} if cuda else {}
            dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=nccl_timeout_s(timeout_s) if cuda
                                                               else timeout_s), **extra)
            # the per-step agreement and the start barrier: a gloo group (CPU tensors; monitored_barrier is bounded)
            agree = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
            meshes = _meshes(world, device)
        except Exception as exc:  # noqa: BLE001 - named with the group, the rank and the bound
            if dist.is_initialized():
                dist.destroy_process_group()
            raise ParallelError(f"rank {rank} of DiT group {group_id} could not join at {address} within "
                                f"{join_timeout_s:.0f} s: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
        _GROUP = Group(group_id, rank, world, timeout_s, backend, agree_group=agree, meshes=meshes,
                       owner=threading.get_ident())
        log.info("joined DiT group %s as rank %d of %d at %s (%s, collectives bounded by %.1f s) in %.3f s", group_id,
                 rank, world, address, backend, timeout_s, time.perf_counter() - t0)
        return _GROUP


def leave() -> bool:
    """Leave the current group (its peers' pending collectives fail at once instead of waiting for the timeout).
    Only the thread running the group's collectives destroys it: from another thread while a request runs on it, the
    group is left at once (``current()`` is None) and destroyed by its owner when that request ends."""
    global _GROUP
    was = _GROUP
    _GROUP = None
    if was is not None and was.busy and threading.get_ident() != was.owner:
        was.doomed = True
        log.info("DiT group %s left from another thread during a request: destroyed when it ends", was.group_id)
        if was.backend != "gloo":  # NCCL: abort (the cross-thread way) so the owner's collective ends now
            try:
                dist.distributed_c10d._abort_process_group()
            except Exception as exc:  # noqa: BLE001 - the owner's collective still ends at its bound
                log.warning("aborting DiT group %s: %s", was.group_id, exc)
        return True
    _destroy(was)
    return was is not None


def _destroy(was: Group | None) -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as exc:  # noqa: BLE001 - a broken group is gone either way
            log.warning("leaving DiT group %s: %s", was.group_id if was else "?", exc)


def member(spec, what: str) -> Group:
    """This process's group, checked to be the one ``spec`` (a ``wire.ParallelCall``) names, at its rank: else one
    sentence (``what``: the request or forward it came with)."""
    group = _GROUP
    if group is None or (group.group_id, group.rank, group.world) != (spec.group_id, spec.rank, spec.world):
        have = f"group {group.group_id} rank {group.rank} of {group.world}" if group else "no group"
        raise ParallelError(f"this DiT worker is in {have}, and {what} is for group {spec.group_id} rank {spec.rank} "
                            f"of {spec.world}: form the group again.")
    return group


def agree_stop(stop: bool, group: Group) -> bool:
    """Whether any rank wants to stop before this step (an all-reduce of one integer, MAX): all ranks stop together,
    so none is left waiting inside a collective."""
    flag = torch.tensor([1 if stop else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group.agree_group)
    return bool(flag.item())


def barrier(group: Group, timeout_s: float) -> None:
    """Every rank has its payload and its model ready (their receipts and loads differ in time): bounded."""
    dist.monitored_barrier(group=group.agree_group, timeout=datetime.timedelta(seconds=timeout_s))


# ---------------------------------------------------------------------------------------------------- the model
@contextlib.contextmanager
def _cpu_counts_as_one_device():
    """diffusers 0.42.1 ``ModelMixin._resolve_parallel_config`` computes ``rank % torch.accelerator.device_count()``,
    which is a ZeroDivisionError on a CPU-only machine (no accelerator). The device it derives is only recorded,
    never used by context parallelism, so the CPU counts as one device for the length of the call."""
    if torch.accelerator.is_available():
        yield
        return
    real = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = real


def _all_gather_padded(tensor, dim, group):
    """diffusers' uneven output gather (``ulysses_anything``), for gloo, which refuses all_gather of unequal
    shards: pad each shard to the longest, gather, trim. NCCL takes the uneven gather as is."""
    t0 = time.perf_counter()
    try:
        if uneven_gather_ok(str(dist.get_backend(group=group)), tensor.device.type):
            return _REAL_GATHER(tensor, dim, group)
        return _padded(tensor, dim, group)
    finally:
        if _CLOCK is not None:
            _CLOCK.add(time.perf_counter() - t0)


def uneven_gather_ok(backend: str, device_type: str) -> bool:
    """Whether the backend that carries a tensor on ``device_type`` takes an uneven ``all_gather``: NCCL does, gloo
    does not. ``backend`` as ``dist.get_backend`` gives it: ``gloo``, ``nccl`` or ``cpu:gloo,cuda:nccl``."""
    if ":" in backend:
        parts = dict(p.split(":", 1) for p in backend.split(","))
        backend = parts.get(device_type, parts.get("cpu", backend))
    return backend == "nccl"


def _padded(tensor, dim, group):
    tensor = tensor.contiguous()
    sizes = cp_hooks.gather_size_by_comm(tensor.shape[dim], group)
    longest = max(sizes)
    if tensor.shape[dim] < longest:
        pad = list(tensor.shape)
        pad[dim] = longest - tensor.shape[dim]
        tensor = torch.cat([tensor, tensor.new_zeros(pad)], dim=dim)
    parts = [torch.empty_like(tensor) for _ in sizes]
    dist.all_gather(parts, tensor, group=group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes)], dim=dim)


_REAL_GATHER = cp_hooks._all_gather_anything
cp_hooks._all_gather_anything = _all_gather_padded  # one place, at import: only a rank process imports this module


class CommClock:
    """Seconds spent inside diffusers' collectives (each waited for, so a slower peer's time counts too)."""

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0
        self.rows = 0  # the packed sequence's length, before diffusers splits it

    def add(self, seconds: float) -> None:
        self.seconds += seconds
        self.calls += 1


_CLOCK: CommClock | None = None  # the running request's clock (one request at a time per rank process)


class _TimedCollectives:
    """What diffusers' attention dispatch and context-parallel hooks see as ``funcol`` while a clock runs: the same
    functions, each timed to its end (an async collective is waited for at once, as diffusers does right after)."""

    def __init__(self, real, clock: CommClock):
        self._real, self._clock = real, clock

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _timed(self, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        if isinstance(out, self._real.AsyncCollectiveTensor):
            out = out.wait()
        self._clock.add(time.perf_counter() - t0)
        return out

    def all_to_all_single(self, *args, **kwargs):
        return self._timed(self._real.all_to_all_single, *args, **kwargs)

    def all_gather_tensor(self, *args, **kwargs):
        return self._timed(self._real.all_gather_tensor, *args, **kwargs)


@contextlib.contextmanager
def running(group: Group):
    """A request runs the group's collectives on this thread: a :func:`leave` from another thread meanwhile leaves
    at once and the group is destroyed here, when the request ends (never under a running collective)."""
    group.busy = True
    try:
        yield
    finally:
        group.busy = False
        if group.doomed:
            _destroy(group)


@contextlib.contextmanager
def applied(model, group: Group, method: str, clock: CommClock | None = None):
    """Parallelise ``model`` over ``group`` for the length of the block (one request), then make it single-rank
    again: diffusers' hooks removed, its processors' parallel config cleared."""
    mesh = group.meshes.get(method)  # the group's own (a Group made by hand without one: diffusers builds it)
    cfg = (ContextParallelConfig(ulysses_degree=group.world, ulysses_anything=True, mesh=mesh) if method == "ulysses"
           else ContextParallelConfig(ring_degree=group.world, ring_anything=True, mesh=mesh))
    global _CLOCK

    def rows(module, args, kwargs):  # a torch pre-hook runs before diffusers' split (inside the forward wrapper)
        if clock is not None:
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            clock.rows = int(hidden.shape[1]) if hidden is not None else clock.rows

    seen = model.transformer_blocks[0].register_forward_pre_hook(rows, with_kwargs=True)
    with _cpu_counts_as_one_device():
        model.enable_parallelism(config=cfg)
    real = attention_dispatch.funcol
    if clock is not None:
        attention_dispatch.funcol = cp_hooks.funcol = _TimedCollectives(real, clock)
        _CLOCK = clock
    try:
        with running(group):
            yield
    finally:
        attention_dispatch.funcol = cp_hooks.funcol = real
        _CLOCK = None
        seen.remove()
        remove_context_parallel(model, model._cp_plan)
        for module in model.modules():
            processor = getattr(module, "processor", None)
            if processor is not None and hasattr(processor, "_parallel_config"):
                processor._parallel_config = None
        model._parallel_config = None


def gloo_interface_env() -> dict:
    """The environment a rank needs so gloo (and NCCL) bind the cluster's interface rather than the host name's
    address: from ``H3_PARALLEL_IFACE`` (the QSFP interface), else nothing (one machine, or a host name that
    resolves to the right address)."""
    iface = os.environ.get("H3_PARALLEL_IFACE", "")
    return {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface} if iface else {}
