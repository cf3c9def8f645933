"""A ``cuda`` device on a CPU-only torch, for tests: real values computed on the CPU, tagged as living on ``cuda:0``.

PyTorch's own ``FakeTensorMode`` (``torch._subclasses.fake_tensor``) gives tensors on a fake ``cuda`` device on the
CPU build and raises on a device mismatch, but its tensors hold no data: the CPU work around a GPU step (the
scheduler's tables, a JPEG, the copy to the host that crosses the wire) cannot run under it. This mode keeps the data:

* a tensor made on ``cuda`` (a factory with ``device="cuda"``, ``.to("cuda")``, ``.cuda()``, a module moved there) is a
  :class:`CudaTensor`: its ``device`` is ``cuda:0``, its values a CPU tensor inside;
* an op mixing a ``cuda`` tensor with a CPU tensor of one or more dimensions raises the error CUDA raises ("Expected
  all tensors to be on the same device"); CPU scalars (0-dim) and CPU index tensors are allowed, as on CUDA;
* a host read of a ``cuda`` tensor without a copy raises: ``.numpy()`` (as CUDA does) and, with ``strict_host_reads``,
  ``.item()`` / ``.tolist()`` / ``bool()`` (on CUDA each is a hidden synchronize); otherwise they are counted;
* a CPU generator used to make a ``cuda`` tensor raises, as on CUDA;
* autograd is off inside (inference only: a graph on a device the build lacks aborts the process), and
  ``torch.inference_mode()`` is ``no_grad`` (a wrapper tensor cannot be an inference tensor);
* :func:`stand_in_cuda` replaces ``torch.cuda``'s functions the code calls (``synchronize``, ``Event``,
  ``empty_cache``, memory figures, capability) with counters, for the length of a ``with``.

Not a simulator: kernels run on the CPU, in order; it finds the code that assumes the tensors are on the CPU.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten
CUDA = torch.device("cuda", 0)
#: ops that legally take tensors on two devices (copies between them)
_CROSS = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default, aten._copy_from_and_resize.default,
          aten.copy.default, aten.lift_fresh.default, aten.set_.source_Tensor}
#: ops whose index tensors may stay on the CPU for a ``cuda`` self
_INDEX = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
_HOST_READS = {aten._local_scalar_dense.default, aten.is_nonzero.default}


class CudaTensor(torch.Tensor):
    """A tensor whose device is ``cuda:0`` and whose values are the CPU tensor ``elem``."""

    elem: torch.Tensor  # in the instance dict: ``Module.to`` swaps a parameter's guts with it (swap_tensors)

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.size(), strides=elem.stride(),
                                                storage_offset=elem.storage_offset(), dtype=elem.dtype,
                                                layout=elem.layout, device=CUDA, requires_grad=elem.requires_grad)
        r.elem = elem
        return r

    def __repr__(self):
        return f"CudaTensor({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # only outside a FakeCuda mode
        raise RuntimeError(f"{func} on a fake cuda tensor outside FakeCuda(): keep the test inside the mode")

    __torch_function__ = torch._C._disabled_torch_function_impl


def _fake(t) -> bool:
    """A tensor on the fake ``cuda`` (a :class:`CudaTensor`, or a parameter that took one's place by swap)."""
    return isinstance(t, torch.Tensor) and t.device.type == "cuda" and hasattr(t, "elem")


def _is_cuda_device(d) -> bool:
    return d is not None and torch.device(d).type == "cuda"


_SCALAR_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.__int__,
                 torch.Tensor.__bool__, torch.Tensor.__index__}


class _Moves(TorchFunctionMode):
    """``Tensor.to("cuda")`` / ``.cuda()`` of a CPU tensor as the copy op (the CPU build refuses them before any
    dispatch); ``pin_memory`` a no-op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to or func is torch.Tensor.cuda:
            t = args[0]
            if func is torch.Tensor.cuda:
                device, dtype, non_blocking = CUDA, None, kwargs.get("non_blocking", False)
            else:
                device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if _is_cuda_device(device) or (device is None and _fake(t)):
                if _fake(t) and (dtype is None or dtype == t.dtype):
                    return t
                return aten._to_copy.default(t, dtype=dtype or t.dtype, device=CUDA)
        if func in (torch.tensor, torch.as_tensor) and _is_cuda_device(kwargs.get("device")):
            # the binding copies to the device below the dispatcher's Python key: build on the host, then copy
            host = func(*tree_map(lambda t: t.elem if _fake(t) else t, args), **{**kwargs, "device": "cpu"})
            return aten._to_copy.default(host, device=CUDA)
        if func is torch.Tensor.copy_ and (_fake(args[0]) or _fake(args[1])):
            return aten.copy_.default(args[0], args[1])
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _fake(args[0]):
            # Python indexing holds a device guard the CPU build cannot make: index the values, as CUDA would
            def plain(i):
                return i.elem if _fake(i) else i
            idx = args[1]
            idx = tuple(plain(i) for i in idx) if isinstance(idx, tuple) else plain(idx)
            if func is torch.Tensor.__getitem__:
                return CudaTensor(args[0].elem[idx])
            value = args[2]
            if isinstance(value, torch.Tensor) and not _fake(value) and value.dim() > 0:
                raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                                   "cuda:0 and cpu! (in an indexed assignment)")
            args[0].elem[idx] = plain(value)
            return None
        if func in _SCALAR_READS and _fake(args[0]):
            self.owner.host_read(func.__name__)
            if self.owner.log is not None:
                self.owner.log.append("d2h")  # legal on CUDA, and a synchronize each: counted (or refused)
            return func(args[0].elem, *args[1:], **kwargs)
        if func is torch.Tensor.numpy and _fake(args[0]):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        if func is torch.Tensor.pin_memory:
            return args[0]
        try:
            return func(*args, **kwargs)
        except RuntimeError as exc:  # a binding that makes a device guard first (nonzero, ...): run it on the values
            if "not linked with support for cuda" not in str(exc):
                raise
        flat, _ = tree_flatten((args, kwargs))
        if any(isinstance(t, torch.Tensor) and not _fake(t) and t.dim() > 0 for t in flat):
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"cuda:0 and cpu! (in {getattr(func, '__name__', func)})")
        if getattr(func, "__name__", "") in ("nonzero", "unique", "masked_select"):
            self.owner.host_read(func.__name__)  # its output size is read on the host: a synchronize on CUDA
        plain = tree_map(lambda t: t.elem if _fake(t) else t, (args, kwargs))
        out = func(*plain[0], **plain[1])
        return tree_map(lambda t: CudaTensor(t) if isinstance(t, torch.Tensor) else t, out)


class FakeCuda(TorchDispatchMode):
    """The mode (``with FakeCuda() as fc:``); ``fc.host_reads`` lists the ops that read a ``cuda`` value on the host."""

    def __init__(self, strict_host_reads: bool = False, log: list | None = None):
        super().__init__()
        self.strict_host_reads = strict_host_reads
        self.log = log  # with one: "op" per op on cuda, "d2h" per copy to the host (it waits for the queue), "h2d"
        self.host_reads: list = []
        self.cuda_ops = 0
        self._moves = _Moves()
        self._moves.owner = self

    def host_read(self, what: str) -> None:
        self.host_reads.append(what)
        if self.strict_host_reads:
            raise RuntimeError(f"host read of a cuda tensor ({what}): a hidden synchronize; copy it explicitly")

    def __enter__(self):
        self._lazy_init = torch.cuda._lazy_init  # a factory on "cuda" initialises CUDA first: nothing to do here
        torch.cuda._lazy_init = lambda: None
        self._no_grad = torch.no_grad()  # autograd on a device the build lacks aborts the process: inference only
        self._no_grad.__enter__()
        self._inference_mode = torch.inference_mode  # a wrapper tensor cannot be an inference tensor: no_grad instead
        torch.inference_mode = lambda mode=True: torch.no_grad()
        # ``Module.to("cuda")`` replaces each parameter (``param.data = ...`` would keep a CPU Parameter's class)
        self._overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        out = super().__enter__()
        self._moves.__enter__()
        return out

    def __exit__(self, *exc):
        try:
            self._moves.__exit__(*exc)
            return super().__exit__(*exc)
        finally:
            torch.__future__.set_overwrite_module_params_on_conversion(self._overwrite)
            self._no_grad.__exit__(*exc)
            torch.inference_mode = self._inference_mode
            torch.cuda._lazy_init = self._lazy_init

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        on_cuda = [t for t in tensors if _fake(t)]
        target = kwargs.get("device")
        if func in _HOST_READS and on_cuda:
            self.host_read(str(func))
        gen = kwargs.get("generator")
        if gen is not None and (_is_cuda_device(target) or on_cuda) and gen.device.type != "cuda":
            raise RuntimeError("Expected a 'cuda' device type for generator but found 'cpu'")
        if on_cuda and func not in _CROSS:
            args_only = [t for t in tree_flatten(args[1:] if func in _INDEX else args)[0]
                         if isinstance(t, torch.Tensor)] + [t for t in tree_flatten(kwargs)[0]
                                                            if isinstance(t, torch.Tensor)]
            if func in _INDEX:
                args_only = [t for t in args_only if t.dtype not in (torch.int64, torch.int32, torch.bool)]
            bad = [t for t in args_only if not _fake(t) and t.dim() > 0]
            if bad:
                raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                                   f"cuda:0 and cpu! (in {func}, a cpu tensor of shape {tuple(bad[0].shape)})")
        unwrap = {id(t): t.elem for t in on_cuda}
        fresh_args = tree_map(lambda x: unwrap.get(id(x), x) if isinstance(x, torch.Tensor) else x, args)
        fresh_kwargs = tree_map(lambda x: unwrap.get(id(x), x) if isinstance(x, torch.Tensor) else x, kwargs)
        to_cuda = bool(on_cuda)
        if "device" in fresh_kwargs:
            to_cuda = _is_cuda_device(fresh_kwargs["device"]) or (fresh_kwargs["device"] is None and to_cuda)
            if _is_cuda_device(fresh_kwargs["device"]):
                fresh_kwargs["device"] = torch.device("cpu")
        elif func in _CROSS and func is not aten._to_copy.default:
            to_cuda = _fake(args[0])  # a copy lands where its destination is
        if fresh_kwargs.get("pin_memory"):
            fresh_kwargs["pin_memory"] = False
        out = func(*fresh_args, **fresh_kwargs)
        if to_cuda:
            self.cuda_ops += 1
        if self.log is not None and on_cuda and not getattr(func, "is_view", False):  # a view queues no kernel
            self.log.append("op" if to_cuda else "d2h")
        elif self.log is not None and to_cuda and func is aten._to_copy.default:
            self.log.append("h2d")  # from pageable host memory: the host waits for the copy
        back = {id(t.elem): t for t in on_cuda}  # in-place ops return their (wrapped) self

        def wrap(x):
            if not isinstance(x, torch.Tensor):
                return x
            if id(x) in back:
                return back[id(x)]
            return CudaTensor(x) if to_cuda else x

        return tree_map(wrap, out)


class _Event:
    def __init__(self, counts, enable_timing=False, **_):
        self.counts, self.t = counts, None

    def record(self, stream=None):
        self.t = time.perf_counter()
        self.counts.events += 1

    def synchronize(self):
        self.counts.synchronize()

    def query(self):
        return True

    def elapsed_time(self, end) -> float:
        return (end.t - self.t) * 1e3


@dataclass
class CudaCounts:
    """What the code asked of ``torch.cuda`` under :func:`stand_in_cuda`; ``log`` orders syncs and clock reads."""

    syncs: int = 0
    empty_caches: int = 0
    events: int = 0
    log: list = field(default_factory=list)
    where: dict = field(default_factory=dict)  # log index of a clock read -> the file:line that read it
    capability: tuple = (12, 1)
    name: str = "NVIDIA GB10"
    free: int = 100 << 30
    total: int = 120 << 30
    reserved: int = 0
    allocated: int = 0

    def synchronize(self, *_a, **_k):
        self.syncs += 1
        self.log.append("sync")

    def empty_cache(self):
        self.empty_caches += 1
        self.reserved = self.allocated
        self.log.append("empty_cache")


def unsynced_clock_reads(log: list, where: dict | None = None) -> list:
    """Indexes in ``log`` of the clock reads that follow work queued on the GPU with no synchronize (nor copy to the
    host, which waits for the queue) in between: a clock that reads the launch, not the work."""
    bad, pending = [], False
    for i, what in enumerate(log):
        if what == "op":
            pending = True
        elif what in ("sync", "d2h"):
            pending = False
        elif what == "clock" and pending:
            bad.append(where.get(i, i) if where is not None else i)
    return bad


@contextlib.contextmanager
def stand_in_cuda(counts: CudaCounts | None = None, *, clock_log: bool = False):
    """``torch.cuda`` as a machine with one GPU (``counts``' name, capability, memory figures), its calls counted.
    With ``clock_log`` every ``time.perf_counter()`` read is appended to ``counts.log`` as ``"clock"`` too."""
    counts = counts or CudaCounts()
    c = torch.cuda
    fakes = {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "synchronize": counts.synchronize, "empty_cache": counts.empty_cache,
        "Event": lambda *a, **k: _Event(counts, *a, **k),
        "get_device_capability": lambda *_: counts.capability, "get_device_name": lambda *_: counts.name,
        "mem_get_info": lambda *_: (counts.free, counts.total),
        "memory_reserved": lambda *_: counts.reserved, "memory_allocated": lambda *_: counts.allocated,
        "max_memory_allocated": lambda *_: counts.allocated, "reset_peak_memory_stats": lambda *_: None,
        "set_device": lambda *_: None, "is_initialized": lambda: True,
    }
    saved = {k: getattr(c, k) for k in fakes}
    real_clock = time.perf_counter
    try:
        for k, v in fakes.items():
            setattr(c, k, v)
        if clock_log:
            def clock():
                counts.log.append("clock")
                f = sys._getframe(1)
                counts.where[len(counts.log) - 1] = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
                return real_clock()
            time.perf_counter = clock
        yield counts
    finally:
        time.perf_counter = real_clock
        for k, v in saved.items():
            setattr(c, k, v)


def to_cuda(module_or_tensor):
    """A module's parameters and buffers (or one tensor) moved onto the fake ``cuda`` device (inside ``FakeCuda``)."""
    return module_or_tensor.to("cuda")
