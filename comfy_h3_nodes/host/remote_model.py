"""ComfyUI's ``MODEL`` for MiniMax-H3 with the DiT on machine B: ComfyUI's own model, every forward on B.

What A builds, as ComfyUI's ``UNETLoader`` would for the same file, from B's answer (tensor names, shapes, dtypes and
metadata of the file B loaded; no weights): ComfyUI's model detection on meta tensors gives its model config
(sampling, ``model_sampling``, latent format); ComfyUI's ``MiniMaxH3`` model is built on the meta device, and its
``diffusion_model`` is replaced by :class:`RemoteH3Model`, which holds no tensors: ComfyUI's model management sees a
model of no bytes and never evicts the text encoder or the VAEs for it, and asks for no inference memory beyond the
rows that cross.

:class:`RemoteH3Model` is ComfyUI's ``MiniMaxH3Model`` (its ``forward`` is ComfyUI's: the audio stream's carried
scale, the diffusion-model wrappers) with ``_forward`` translating ComfyUI's arguments (the packed latent, the
sigma, the text states, ``minimax_payload``'s layout, guides and references, the denoise masks) into diffusers'
``MiniMaxH3Transformer3DModel.forward`` arguments with ComfyUI's own helpers (``PackedLayout``, ``patchify_video``,
``pack_audio``, ``mask_row_values``, ``time_shift_sigma``), running them on B
(:mod:`~..engine.executor.remote_forward`) and turning B's output rows back into ComfyUI's output. The text states go
to B unrefined (``preprocess_text_embeds`` is the identity here): B's ``context_embedder`` and token refiner run them
in each forward, as ComfyUI's own ``_forward`` does for states it was given unrefined.

A ``transformer_options`` entry that asks the DiT to do something B cannot (a block replacement, an attention patch
another pack put there) is refused in one sentence that names it.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from typing import Callable

import comfy.latent_formats
import comfy.ldm.common_dit
import comfy.ldm.minimax.model as c_dit
import comfy.model_detection
import comfy.model_management
import comfy.model_patcher
import comfy.patcher_extension
import comfy.weight_adapter
import ray
import torch

from ..engine import session
from ..engine.contract import wire
from ..engine.contract.forward_payloads import ComfyLora, ComfyLoraSet, ForwardContext
from ..engine.contract.errors import H3Cancelled
from ..engine.executor import remote_forward
from ..engine.model import comfy_keys

#: safetensors dtype names as B reports them -> torch
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}

#: transformer_options keys ComfyUI's samplers set themselves, or that A honours around the remote forward
KNOWN_OPTIONS = {"cond_or_uncond", "uuids", "sigmas", "sample_sigmas", "wrappers", "callbacks", "model_options",
                 "prefetch_dynamic_vbars", "minimax_h3_sigma_shift_video", "minimax_h3_sigma_shift_audio",
                 "transformer_index", "patches_replace", "patches", "hooks", "rope_options", "to_load_options",
                 "current_index", "activations_shape", "block_modifiers", "optimized_attention_override"}
#: of those, the ones that would change what the DiT computes inside: refused unless empty
DIT_PATCHES = ("patches_replace", "patches", "block_modifiers", "optimized_attention_override")
SAMPLING_KEY = "comfy_h3_remote_dit"
#: LoRA sets put in this process's object store, by (layer, strength, tensor addresses): B keeps each by its id
_LORA_SETS: OrderedDict = OrderedDict()
LORA_SETS_KEPT = 4
session.CACHE_SIZES["lora_sets_a"] = lambda: len(_LORA_SETS)
_LORA_LOCK = threading.Lock()


def _tensors_of(adapter) -> list:
    weights = getattr(adapter, "weights", adapter if isinstance(adapter, tuple) else ())
    return [t for t in weights if isinstance(t, torch.Tensor)]


def refuse_patches(options: dict) -> None:
    for key in DIT_PATCHES:
        value = options.get(key)
        if value:
            what = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(
                f"transformer_options[{key!r}] holds {what}: a patch of the DiT's inside that B, which runs "
                "diffusers' transformer, cannot apply; remove the node that adds it, or use core's UNETLoader "
                "for this graph.")
    unknown = sorted(k for k, v in options.items() if k not in KNOWN_OPTIONS and v not in (None, {}, [], ()))
    if unknown:
        raise ValueError(
            f"transformer_options has {unknown[0]!r}, which the DiT on B does not know (another pack put it "
            "there for ComfyUI's own model); remove that node, or use core's UNETLoader for this graph.")


def refuse_other_workflow(partition: str, payload: dict, file_name: str = "") -> None:
    """A transformer file of another workflow than the graph's is refused in one sentence: a ref2va file
    (``transformer_ref``) in a graph without reference images (t2va / i2va: MiniMaxH3ImageToVideo), or a t2va / i2va
    file in a graph with them (MiniMaxH3ReferenceToVideo). B would otherwise sample with the wrong weights."""
    refs = bool(payload.get("refs"))
    file = f" ({file_name})" if file_name else ""
    if partition == "transformer_ref" and not refs:
        raise ValueError(f"H3RemoteModel's unet_name is a ref2va transformer{file}, but this graph has no reference "
                         "images (a t2va / i2va graph: MiniMaxH3ImageToVideo); choose the t2va / i2va file in "
                         "unet_name, or condition with MiniMaxH3ReferenceToVideo.")
    if partition != "transformer_ref" and refs:
        raise ValueError(f"H3RemoteModel's unet_name is a t2va / i2va transformer{file}, but this graph conditions on "
                         "reference images (MiniMaxH3ReferenceToVideo: a ref2va graph); choose the ref2va file in "
                         "unet_name, or condition with MiniMaxH3ImageToVideo.")


class RemoteH3Model(c_dit.MiniMaxH3Model):
    """ComfyUI's H3 diffusion model whose forwards run on B. No parameters or buffers live here."""

    def __init__(self, like: c_dit.MiniMaxH3Model, open_sampling: Callable[[], remote_forward.RemoteSampling],
                 interrupted: Callable[[], bool], on_done: Callable[[dict], None] | None = None,
                 partition: str = "transformer"):
        torch.nn.Module.__init__(self)
        self.partition = partition
        self.file_name = ""  # the file B serves, as the node names it (build_model sets it)
        self.file_tensors: dict = {}  # name -> (shape, dtype) of the file B serves (build_model sets them)
        for name in ("dtype", "hidden_size", "patch_size", "latents_dim", "audio_latents_dim", "sigma_shift_video",
                     "sigma_shift_audio", "use_adaln_curves"):
            setattr(self, name, getattr(like, name))
        self.open_sampling = open_sampling
        self.interrupted = interrupted
        self.on_done = on_done
        self.sampling: remote_forward.RemoteSampling | None = None
        self.finished: list[dict] = []  # summaries of the samplings this model ran (the readout's source)
        self._lock = threading.Lock()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """The file's tensors as meta tensors (no memory): ComfyUI's LoRA loaders map a LoRA's keys to the model's
        by these names, and its patcher records a patch only for a name the model has."""
        for name, (shape, dtype) in self.file_tensors.items():
            destination[prefix + name] = torch.empty(shape, dtype=dtype, device="meta")

    def preprocess_text_embeds(self, text_states):
        return text_states  # B refines them in each forward

    @contextlib.contextmanager
    def one_sampling(self, patches: dict | None = None):
        """The forwards of one sampler run on one B worker, with the sampling model's LoRA patches (``patches``:
        its ``ModelPatcher.patches``) put on B once per set."""
        lora_ref = self._lora_ref(patches or {})
        with self._lock:
            self.sampling = self.open_sampling()
            self.sampling.lora_ref = lora_ref
        try:
            yield self.sampling
        finally:
            with self._lock:
                done, self.sampling = self.sampling, None
            self._finish(done)

    def _lora_ref(self, patches: dict):
        """The object reference of the LoRA set ``patches`` make (None: no LoRA), put once per set: the same file at
        the same strength (ComfyUI's LoRA loader keeps the file's tensors between prompts) crosses no more."""
        keep = [(k, p) for k, plist in sorted(patches.items()) for p in plist]
        if not keep:
            return None
        key = tuple((k, float(p[0]), *(t.data_ptr() for t in _tensors_of(p[1]))) for k, p in keep)
        with _LORA_LOCK:
            hit = _LORA_SETS.get(key)
            if hit is not None:
                _LORA_SETS.move_to_end(key)
                return hit[0]
        # the same file loaded again (ComfyUI's cache gave its loader's output up, --cache-none): the same content
        content = ("content", tuple((k, float(p[0])) for k, p in keep),
                   remote_forward.fingerprint(*(t for _, p in keep for t in _tensors_of(p[1]))))
        with _LORA_LOCK:
            hit = _LORA_SETS.get(content)
        if hit is not None:
            ref = hit[0]
        else:
            lora = lora_set(patches)
            ref = None if lora is None else ray.put(lora.validate())
        with _LORA_LOCK:
            # the tensors stay referenced while cached: their addresses stay theirs. Bounded: 4 sets (each under
            # both keys), the oldest dropped first (its object-store copy with it)
            _LORA_SETS[key] = _LORA_SETS[content] = (ref, keep)
            while len(_LORA_SETS) > LORA_SETS_KEPT * 2:
                _LORA_SETS.popitem(last=False)
        return ref

    def _finish(self, sampling) -> None:
        summary = sampling.summary()
        self.finished.append(summary)
        del self.finished[:-8]
        if self.on_done is not None:
            self.on_done(summary)

    def _forward(self, x, timestep, context, transformer_options={}, minimax_payload=None, denoise_mask=None,
                 audio_denoise_mask=None, **kwargs):
        refuse_patches(transformer_options)
        refuse_other_workflow(self.partition, minimax_payload or {}, self.file_name)
        sampling = self.sampling
        own = sampling is None  # a forward outside a sampler run (another pack calling the model): one of its own
        if own:
            sampling = self.open_sampling()
        try:
            return self._remote(sampling, x, timestep, context, transformer_options, minimax_payload or {},
                                denoise_mask, audio_denoise_mask)
        finally:
            if own:
                self._finish(sampling)

    def _remote(self, sampling, x, timestep, context, options, payload, denoise_mask, audio_denoise_mask):
        video_x, audio_x = x[0], x[1]
        orig_t, orig_h, orig_w = video_x.shape[2], video_x.shape[3], video_x.shape[4]
        video_x = comfy.ldm.common_dit.pad_to_patch_size(video_x, self.patch_size)
        batch = video_x.shape[0]
        latent_t, lat_h, lat_w = video_x.shape[2], video_x.shape[3], video_x.shape[4]
        audio_t = audio_x.shape[-1]
        text_len = context.shape[1]
        layout = payload.get("layout")
        if layout is None or layout.signature != (text_len, latent_t, lat_h, lat_w, audio_t):
            layout = c_dit.PackedLayout(text_len, latent_t, lat_h, lat_w, audio_t, keyframes=payload.get("keyframes"),
                                        refs=payload.get("refs"))

        # the noise level of each kind of row, as ComfyUI's model sets them (sigma = timestep / 1000)
        shift_v = float(options.get("minimax_h3_sigma_shift_video", self.sigma_shift_video))
        shift_a = float(options.get("minimax_h3_sigma_shift_audio", self.sigma_shift_audio))
        sigma_v = (timestep.flatten()[0] / 1000.0).float().clamp(min=1e-6).cpu()
        t_v = float(1.0 - sigma_v)
        t_a = float(1.0 - c_dit.time_shift_sigma(sigma_v, shift_v, shift_a))
        vis = float(payload.get("visual_cond_noise_aug", c_dit.VISUAL_COND_TIMESTEP))
        aud = float(payload.get("audio_cond_noise_aug", c_dit.AUDIO_COND_TIMESTEP))
        seg_t = {"text": t_v, "video": t_v, "audio": t_a, "cond": max(t_v, vis), "ref_img": max(t_v, vis),
                 "cond_audio": max(t_a, aud), "ref_audio": max(t_a, aud)}
        rows_t = {"video": None, "audio": None}  # per-row levels where a denoise mask makes them differ
        if denoise_mask is not None:
            m = c_dit.mask_row_values(denoise_mask[0, 0].to(torch.float32).cpu(), latent_t, lat_h, lat_w)
            if m is not None:
                r = (1.0 - m * sigma_v).clamp(max=max(t_v, c_dit.VISUAL_COND_TIMESTEP))
                seg_t["video"], rows_t["video"] = (float(r[0]), None) if r.unique().numel() == 1 else (t_v, r)
        if audio_denoise_mask is not None:
            m = audio_denoise_mask[0, 0].to(torch.float32).reshape(-1).cpu()
            if not bool((m >= 1.0 - 1e-3).all()):
                r = (1.0 - m * (1.0 - t_a)).clamp(max=max(t_a, c_dit.AUDIO_COND_TIMESTEP))
                seg_t["audio"], rows_t["audio"] = (float(r[0]), None) if r.unique().numel() == 1 else (t_a, r)
        levels = {t_v, t_a} | {seg_t[k] for _, _, k in layout.segments}
        for r in rows_t.values():
            if r is not None:
                levels |= set(r.unique().tolist())
        unique_t = sorted(levels)
        t_row = {t: i for i, t in enumerate(unique_t)}

        # per row of the packed sequence the index of its level: the only part of the layout that changes per step
        t_idx = torch.empty(layout.seq_len, dtype=torch.long)
        for a, b, kind in layout.segments:
            r = rows_t.get(kind)
            if r is not None:
                t_idx[a:b] = torch.tensor([t_row[v] for v in r.tolist()], dtype=torch.long)
            else:
                t_idx[a:b] = t_row[seg_t[kind]]

        # the sampling context: built (tags, indices, the guide rows with their noise) once per payload and text;
        # the payload is ComfyUI's one dict per sampling and conditioning, kept alive by the cache with its id
        text = context.detach().cpu()
        key = (self.partition, id(payload), layout.signature, remote_forward.fingerprint(text))
        ref = sampling.context_ref(key, lambda: self._context(sampling.sampling_id, layout, payload, text),
                                   keep=payload)

        # the rows in the sampler's own dtype (a permutation of its latent: nothing rounds), fp32 on B's side
        video_rows = c_dit.patchify_video(video_x.detach().cpu(), self.patch_size)
        video_rows = video_rows.reshape(batch, -1, video_rows.shape[-1])
        audio_rows = torch.stack([c_dit.pack_audio(audio_x[i:i + 1].detach().cpu()) for i in range(batch)])
        try:
            v, a = sampling.forward(ref, video_rows, audio_rows, torch.tensor(unique_t, dtype=torch.float32),
                                    t_idx.to(torch.uint8), interrupted=self.interrupted)
        except H3Cancelled:
            raise comfy.model_management.InterruptProcessingException() from None
        video_out = c_dit.unpatchify_video(v.reshape(-1, v.shape[-1]), latent_t, lat_h // 2, lat_w // 2,
                                           self.latents_dim, self.patch_size)
        video_out = video_out[:, :, :orig_t, :orig_h, :orig_w]
        audio_out = torch.cat([c_dit.unpack_audio(a[i]) for i in range(batch)])
        dev = video_x.device
        return [-video_out.to(device=dev, dtype=video_x.dtype), -audio_out.to(device=dev, dtype=audio_x.dtype)]

    def _context(self, sampling_id: str, layout, payload: dict, text) -> ForwardContext:
        """The packed sequence in diffusers' terms (per row its modality tag; the positions of the video, audio and
        text rows), which rows the sampler denoises, and the guide and reference rows ComfyUI's model would embed."""
        tags = torch.empty(layout.seq_len, dtype=torch.long)
        kinds = {"video": [], "audio": [], "text": []}
        text_tags = payload.get("text_token_tags")
        for a, b, kind in layout.segments:
            modality = "text" if kind == "text" else "video" if kind in ("cond", "ref_img", "video") else "audio"
            kinds[modality].append(torch.arange(a, b))
            if kind == "text":
                tags[a:b] = text_tags.reshape(-1).long().cpu() if text_tags is not None else 1
            else:
                tags[a:b] = 0 if modality == "video" else 2
        cond_video = self._cond_video_rows(payload, "cpu")
        cond_audio = self._cond_audio_rows(payload, "cpu")
        vdim = self.latents_dim * self.patch_size[0] * self.patch_size[1] * self.patch_size[2]
        cond_video = torch.zeros(0, vdim) if cond_video is None else cond_video.float().cpu()
        cond_audio = torch.zeros(0, self.audio_latents_dim) if cond_audio is None else cond_audio.float().cpu()
        indices = {m: (torch.cat(v) if v else torch.zeros(0, dtype=torch.long)) for m, v in kinds.items()}
        W = wire.WireTensor.from_torch
        return ForwardContext(sampling_id, W(text), W(tags), W(layout.position_ids.to(torch.float32).cpu()),
                              W(indices["video"]), W(indices["audio"]), W(indices["text"]),
                              W(layout.img_update.cpu().bool()), W(layout.audio_update.cpu().bool()),
                              W(cond_video), W(cond_audio), partition=self.partition)


def lora_set(patches: dict) -> ComfyLoraSet | None:
    """ComfyUI's weight patches of the model (``ModelPatcher.patches``: what its LoRA loaders add) as B applies
    them: LoRA up/down pairs with ComfyUI's factor (``strength * alpha / rank``); strength 0 adds nothing. Any other
    kind of patch (LoHa, LoKr, a full diff, DoRA, a function or an offset) is refused in one sentence: B would
    otherwise sample without it."""
    out = []
    for key, plist in patches.items():
        name = key.removeprefix("diffusion_model.")
        for strength, adapter, strength_model, offset, function in plist:
            kind = getattr(adapter, "name", None) or (adapter[0] if isinstance(adapter, tuple) and adapter
                                                        and isinstance(adapter[0], str) else type(adapter).__name__)
            if not isinstance(adapter, comfy.weight_adapter.LoRAAdapter):
                raise ValueError(f"the {kind} patch on {name} (a LoRA loader's file) is a kind B cannot apply: B "
                                 "applies LoRA up/down patches; convert the file to a plain LoRA, or use core's "
                                 "UNETLoader for this graph.")
            up, down, alpha, mid, dora, reshape = adapter.weights[:6]
            extra = [n for n, v in (("a LoCon mid weight", mid), ("DoRA scales", dora), ("a reshape", reshape),
                                    ("an offset", offset), ("a function", function)) if v is not None]
            if strength_model != 1.0:
                extra.append(f"model strength {strength_model}")
            if extra:
                raise ValueError(f"the LoRA patch on {name} carries {', '.join(extra)}, which B cannot apply: use a "
                                 "plain LoRA, or core's UNETLoader for this graph.")
            if strength == 0:
                continue
            factor = float(strength) * (float(alpha) / down.shape[0] if alpha is not None else 1.0)
            out.append(ComfyLora(name, factor, wire.WireTensor.from_torch(up.flatten(1)),
                                      wire.WireTensor.from_torch(down.flatten(1))))
    return ComfyLoraSet(tuple(out)) if out else None


def _sampling_wrapper(model: RemoteH3Model):
    def wrapper(executor, *args, **kwargs):
        patcher = getattr(executor.class_obj, "model_patcher", None)  # the guider's: the clone with the LoRAs
        with model.one_sampling(getattr(patcher, "patches", None)):
            return executor(*args, **kwargs)
    return wrapper


def build_model(file_info: dict, open_sampling: Callable[[], remote_forward.RemoteSampling],
                interrupted: Callable[[], bool], dtype: torch.dtype | None = None,
                on_done: Callable[[dict], None] | None = None, partition: str = "transformer", file_name: str = ""):
    """ComfyUI's ``ModelPatcher`` for the file B serves (``file_info``: B's ``transformer_file()``), every forward
    on B. ``dtype``: the compute dtype ComfyUI's sampler casts to (default: ComfyUI's choice for the file)."""
    sd = {k: torch.empty(shape, dtype=_DTYPES.get(dt, torch.float32), device="meta")
          for k, (shape, dt) in file_info["tensors"].items()}
    metadata = file_info.get("metadata") or None
    config = comfy.model_detection.model_config_from_unet(sd, "", metadata=metadata)
    if config is None or not isinstance(config.latent_format, comfy.latent_formats.MiniMaxH3AV):
        raise ValueError(f"{file_info['path']} on B is not a MiniMax-H3 transformer ComfyUI detects "
                               "(its tensor names are not Comfy-Org's H3 layout).")
    load_device = comfy.model_management.get_torch_device()
    if dtype is None:
        dtype = comfy.model_management.unet_dtype(model_params=0, supported_dtypes=config.supported_inference_dtypes)
    manual = comfy.model_management.unet_manual_cast(dtype, load_device, config.supported_inference_dtypes)
    config.set_inference_dtype(dtype, manual, device=load_device)
    model = config.get_model(sd, "", device=torch.device("meta"))
    model.diffusion_model = RemoteH3Model(model.diffusion_model, open_sampling, interrupted, on_done,
                                         partition)
    model.diffusion_model.file_name = file_name
    model.diffusion_model.file_tensors = {k: (t.shape, t.dtype) for k, t in sd.items()
                                          if not comfy_keys.is_side_key(k)}
    model.memory_required = lambda *args, **kwargs: 0  # the DiT's working memory is on B
    # size 1: the model's state dict names the file's tensors (for LoRA keys) but none of them is on A
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=load_device,
                                               offload_device=comfy.model_management.unet_offload_device(), size=1)
    patcher.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, SAMPLING_KEY,
                                 _sampling_wrapper(model.diffusion_model))
    return patcher
