"""B's side of ComfyUI's own samplers on A (the pack's ``H3RemoteModel``): one forward of the resident transformer
per call, and the description of the file it serves. A mixin of :class:`.b_side.BSide`, which it needs for the
resident partitions, their sources, the lock, the release/reload and the swap."""

from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch

from comfy_h3_nodes.engine.contract.errors import DenoiseCancelled
from comfy_h3_nodes.engine.contract.forward_payloads import ForwardCall
from comfy_h3_nodes.engine.model import formats, memory_plan, parallel

from .comfy_lora import ComfyLoraHooks


class ComfySamplerForwards:
    """``forward_rows`` and ``transformer_file`` of :class:`.b_side.BSide`."""

    def forward_rows(self, ctx: dict, call: ForwardCall, should_cancel: Callable[[], bool] | None = None,
                     request_id: str = "", lora: tuple = (None, None), ready_timeout: float = 600.0) -> tuple:
        """One forward of diffusers' transformer for a sampler on A (ComfyUI's own, through the remote ``MODEL``):
        ``ctx`` is the materialised :class:`ForwardContext` (torch tensors by field name), ``call`` the
        forward's target rows and timesteps. The guide and reference rows of the context fill the rows the sampler
        does not denoise; only the target rows of diffusers' output go back. ``should_cancel`` is asked before
        every transformer block (ComfyUI's interrupt stops a forward between blocks). ``lora``: ``(key, set)`` of
        ComfyUI's LoRA patches for this sampling (:mod:`.comfy_lora`; ``(None, None)``: none). Returns ``(video, audio,
        compute_s, reload_s, lora_modules)``: tensors of the call's shapes and dtypes, and how many modules the LoRA
        set patches. With ``call.parallel`` this process is one rank of a DiT group: it waits (at most
        ``ready_timeout``) until every rank has the forward and its model, runs it under diffusers' context
        parallelism, and the ranks agree before every block whether to stop, so they stop at the same block."""
        with self._lock:
            reload_s = self.reload_if_released()
            needed = ctx["partition"]
            if needed not in self.resident_partitions:
                reload_s += self._swap_to(needed)
            elif needed != self.partition:
                self._activate(needed)
            self.adapters.activate(())  # a pack request's LoRA does not stay on ComfyUI's sampler
            model = getattr(self._host, self.partition)
            hooks = self._comfy_lora.get(self.partition)
            if hooks is None or hooks.model is not model:  # first use, or the partition was loaded again
                hooks = self._comfy_lora[self.partition] = ComfyLoraHooks(model, self.sources[self.partition].tensors)
            lora_modules = hooks.activate(lora[0], lora[1], self.device, model.dtype)
            video, audio = call.video.to_torch(), call.audio.to_torch()
            batch = video.shape[0]

            def rows(target, cond, x):
                out = torch.empty(batch, target.shape[0], x.shape[-1], dtype=torch.float32, device=self.device)
                out[:, target] = x.to(self.device, torch.float32)  # bf16 rows widen exactly
                out[:, ~target] = cond.to(self.device, torch.float32)
                return out

            vt, at = ctx["video_target"].to(self.device), ctx["audio_target"].to(self.device)
            group, grouped = None, contextlib.nullcontext()
            if call.parallel is not None:
                group = parallel.member(call.parallel, f"forward {call.index + 1} of sampling {request_id}")
                parallel.barrier(group, ready_timeout)
                grouped = parallel.applied(model, group, call.parallel.method)
                asked = should_cancel or (lambda: False)
                should_cancel = lambda: parallel.agree_stop(asked(), group)  # noqa: E731 - every rank, every block
            hooks = []
            if should_cancel is not None:
                blocks = list(model.transformer_blocks)

                def check(where):
                    def hook(_module, *_args):
                        if should_cancel():
                            raise DenoiseCancelled(
                                f"sampling {request_id} was interrupted in forward {call.index + 1} on B, {where}")
                    return hook
                n = len(blocks)
                hooks = [b.register_forward_pre_hook(check(f"before transformer block {i + 1} of {n}"))
                         for i, b in enumerate(blocks)]
                hooks.append(blocks[-1].register_forward_hook(check(f"after transformer block {n} of {n}")))
            cuda = self.device.startswith("cuda")
            t0 = time.perf_counter()
            try:
                with grouped, torch.inference_mode():
                    out = model(hidden_states=rows(vt, ctx["cond_video"], video),
                                audio_hidden_states=rows(at, ctx["cond_audio"], audio),
                                encoder_hidden_states=ctx["text"].to(self.device),
                                timestep=call.timestep.to_torch().to(self.device),
                                timestep_indices=call.timestep_indices.to_torch().long().to(self.device),
                                token_tags=ctx["token_tags"].to(self.device),
                                position_ids=ctx["position_ids"].to(self.device),
                                video_indices=ctx["video_indices"].to(self.device),
                                audio_indices=ctx["audio_indices"].to(self.device),
                                text_indices=ctx["text_indices"].to(self.device))
                    v = out.sample[:, vt].to(video.dtype).cpu()
                    a = out.audio_sample[:, at].to(audio.dtype).cpu()
                if cuda:
                    torch.cuda.synchronize()
            except DenoiseCancelled:
                raise
            except Exception:
                if group is not None:  # the peers' next collective fails at once, not after the timeout
                    parallel.leave()
                raise
            finally:
                for h in hooks:
                    h.remove()
            return v, a, time.perf_counter() - t0, reload_s, lora_modules

    def transformer_file(self, partition: str = "transformer") -> dict:
        """The file of the partition ComfyUI's samplers run: its path, tensor names with shape and dtype as stored,
        and its metadata, so that A's ComfyUI detects the model from the file as it would for a local copy. A
        diffusers folder has no such file and is refused in one sentence."""
        src = self.sources.get(partition)
        if src is None or src.kind != "single_file":
            where = "none" if src is None else f"a {src.kind} ({src.path})"
            raise formats.FormatError(
                f"ComfyUI's own samplers need B's {partition} as one Comfy-Org .safetensors file, and B serves "
                f"{where}: pick a minimax_h3_*.safetensors file (B's picker lists them).")
        return {"path": str(src.path), "metadata": dict(src.metadata or {}),
                "tensors": {k: [list(t.shape), t.dtype] for k, t in src.tensors.items()},
                "dtype": self.dtype, "runs": memory_plan.runs_as(src, self.precision, self.dtype)}
