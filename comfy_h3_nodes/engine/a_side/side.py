"""The A side: text/reference encoding and VAE decode on resident models, built from diffusers' own blocks.

A loads only ``text_encoder``, ``tokenizer``, ``processor``, ``vae`` and ``audio_vae``: from the diffusers folder, or
each of the text encoder, video VAE and audio VAE from a Comfy-Org single file (``parts``; :mod:`..model.comfy_files`:
the folder then gives the index and whatever is not a file; with no folder, the released configs shipped with the
pack). ``encode`` runs the A-encode blocks of the request's workflow and packs what B needs into an
:class:`~.wire.EncodedRequest`; ``decode`` runs the ``decode.*`` blocks on a :class:`~.wire.DenoisedLatents` (their
``pt`` output, its frames laid out by :func:`frames_hwc`); ``decode_split`` runs the same blocks with the last clips
taken from B's share (:mod:`.split_decode`). The Ray actor of the executor wraps this class.

Residency: ``release(components, cause)`` drops the text encoder and VAEs (a host's unload: ComfyUI's model
management calls it through the host's patchers), ``resident_bytes()`` is the side's own count of what it holds, and
every ``encode``/``decode`` first reloads what it needs (``ensure``), checked against the memory plan, with load
records whose reason is ``reloaded after <cause>``. The tokenizer and processor (no weights) stay.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3AudioReference, MiniMaxH3ImageReference
from diffusers.modular_pipelines.minimax_h3.modular_pipeline import resolve_canvas_size

from ..contract import wire
from ..contract.configs import A_COMPONENTS, MODEL_COMPONENTS_A
from ..contract.timing import StageRecord
from ..contract.request import EncodeRequest, ValidEncode, validate_encode
from ..media import resample_audio
from ..model import catalog, comfy_files, formats, memory_plan, split, split_decode
from ..model.backends import resolve_attention_backend
from ..model.folders import check_model_dir
from ..model.quant import tensor_nbytes
from ..process import maybe_profile

#: what each use of the side needs resident (encode: the VAEs too, for keyframes, references and the canvas)
NEEDS = {"encode": MODEL_COMPONENTS_A, "decode": ("vae", "audio_vae")}


@dataclass
class DecodedMedia:
    """What A hands back to its caller: float frames ``[F,H,W,3]`` in 0..1, stereo ``[2,N]`` audio, the rates."""

    request_id: str
    frames: np.ndarray
    audio: np.ndarray
    sample_rate: int
    fps: int = 24
    timings: dict = field(default_factory=dict)


class ASide:
    """Resident encoders and VAEs. One instance per process; ``encode``/``decode`` may be called for any workflow."""

    def __init__(self, model_dir: str | os.PathLike | None, dtype: str = "bfloat16", attention_backend: str = "sdpa",
                 device: str | None = None, memory_limit_bytes: int | None = None, parts: dict | None = None,
                 tokenizer_dirs: tuple = (), held_elsewhere: dict | None = None):
        self.attention_backend = resolve_attention_backend(attention_backend)
        self.device = split.pick_device(device)
        self.dtype = dtype
        parts = {k: str(v) for k, v in (parts or {}).items() if v}
        bad = sorted(set(parts) - set(MODEL_COMPONENTS_A))
        if bad:
            raise formats.FormatError(f"parts {bad} cannot come from a file; expected some of {MODEL_COMPONENTS_A}.")
        from_folder = tuple(c for c in A_COMPONENTS if c not in parts
                            and not (c in ("tokenizer", "processor") and "text_encoder" in parts))
        if model_dir is None and from_folder:
            raise formats.FormatError(f"with no model folder every part must come from a file; {from_folder[0]} does "
                                      "not: choose its file, or give model_path.")
        self.model_dir = check_model_dir(model_dir if model_dir is not None else formats.RELEASED_CONFIG_DIR,
                                         from_folder)
        #: the parts loaded from single files (component -> PartSource: file, variant, where its configs come from)
        self.parts = {c: comfy_files.detect_part(p, c, model_dir, tokenizer_dirs) for c, p in parts.items()}
        # the text encoder and VAEs at this dtype + decode working memory, against what A has: refused before loading
        self.memory_limit_bytes = memory_limit_bytes
        self.memory_plan = memory_plan.plan_a(self.model_dir, MODEL_COMPONENTS_A, dtype, self.device,
                                              limit_bytes=memory_limit_bytes, parts=self.parts,
                                              held_elsewhere=held_elsewhere).check()
        loaded = split.load_checked(self.model_dir, from_folder, dtype, self.device)
        self._host = loaded.host
        self.load_records = loaded.records
        if self.parts:
            self.load_records.extend(comfy_files.load_parts(self._host, self.parts, dtype, self.device,
                                                                catalog.cache_root()))
        self._pipes: dict[tuple[str, str], object] = {}
        self._accepts: dict[tuple[str, str], set[str]] = {}
        self._decode_lock = threading.Lock()  # one decode at a time: a split decode overrides a method of the VAE
        self._use = threading.RLock()  # a release waits for the encode or decode using the models
        #: component -> why it was released (``ComfyUI freed memory``), until it is loaded again
        self.released: dict[str, str] = {}
        #: the reloads of the last ``ensure`` that loaded something (what the next readout reports)
        self.last_reload: list[split.LoadRecord] = []
        self.reloads = 0
        self._geometry = split_decode.geometry(self._host.vae)

    # ------------------------------------------------------------------------------------------------ residency
    def resident_bytes(self) -> dict[str, int]:
        """The side's own count: bytes of the parameters and buffers of each loaded text encoder / VAE."""
        out = {}
        for name in MODEL_COMPONENTS_A:
            model = getattr(self._host, name, None)
            if model is not None and hasattr(model, "parameters"):
                out[name] = int(sum(tensor_nbytes(t) for t in (*model.parameters(), *model.buffers())))
        return out

    def release(self, components: tuple | list | None = None, cause: str = "a release",
                collect: bool = True) -> dict[str, int]:
        """Drop ``components`` (default: the text encoder and both VAEs) after any encode or decode using them;
        returns the bytes each held. The next use reloads them (:meth:`ensure`). ``collect=False`` leaves the garbage
        collection to the caller: ComfyUI unloads inside a loop over its loaded models, and a collection there runs
        the finalizers of other models it tracks, which change that list under the loop."""
        names = tuple(components) if components else MODEL_COMPONENTS_A
        bad = sorted(set(names) - set(MODEL_COMPONENTS_A))
        if bad:
            raise ValueError(f"A cannot release {bad}; it holds {list(MODEL_COMPONENTS_A)}.")
        with self._use:
            held = self.resident_bytes()
            freed = {}
            for name in names:
                if name in held:
                    setattr(self._host, name, None)
                    freed[name] = held[name]
                    self.released[name] = cause
            if freed:
                self._pipes.clear()  # they hold the components too
                self._accepts.clear()
                if collect:
                    gc.collect()
                if self.device.startswith("cuda"):
                    torch.cuda.empty_cache()
        return freed

    def ensure(self, components: tuple | list = MODEL_COMPONENTS_A,
               held_elsewhere: dict | None = None) -> list[split.LoadRecord]:
        """Load again what of ``components`` was released, after the memory plan for them says it fits (else
        :class:`~..model.memory_plan.MemoryPlanError`, with the numbers and the options); returns the new load
        records (their reason: ``reloaded after <cause>``), empty when everything was resident."""
        with self._use:
            todo = [c for c in MODEL_COMPONENTS_A if c in components and c in self.released]
            if not todo:
                return []
            memory_plan.plan_a(self.model_dir, tuple(todo), self.dtype, self.device,
                               limit_bytes=self.memory_limit_bytes,
                               parts={c: p for c, p in self.parts.items() if c in todo},
                               held_elsewhere=held_elsewhere).check()
            records = []
            for name in todo:
                reason = f"reloaded after {self.released[name]}"
                if name in self.parts:
                    new = comfy_files.load_parts(self._host, {name: self.parts[name]}, self.dtype, self.device,
                                                 catalog.cache_root())
                    for r in new:
                        r.reason = f"{reason} (file {self.parts[name].path.name})"
                else:
                    new = split.load_checked(self.model_dir, (name,), self.dtype, self.device, reason=reason,
                                             host=self._host).records
                records.extend(new)
                del self.released[name]
            self._pipes.clear()
            self._accepts.clear()
            self.load_records.extend(records)
            self.last_reload = records
            self.reloads += 1
            return records

    # ------------------------------------------------------------------------------------------------ helpers
    def _pipe(self, workflow: str, part: str):
        key = (workflow, part)
        if key not in self._pipes:
            blocks = split.split_workflow(workflow)[part]
            self._accepts[key] = {p.name for p in blocks.inputs if p.name}
            self._pipes[key] = split.make_group_pipeline(blocks, self.model_dir, self._host, A_COMPONENTS)
        return self._pipes[key]

    def resident(self) -> dict[str, str]:
        """What A holds: each component's class, or ``released (<cause>)``."""
        return {n: (f"released ({self.released[n]})" if n in self.released else type(getattr(self._host, n)).__name__)
                for n in A_COMPONENTS}

    @property
    def audio_rate(self) -> int:
        """The audio VAE's sample rate: what a reference voice is resampled to (with PyAV, on A)."""
        return int(self._host.audio_vae.config.sampling_rate)

    def default_canvas(self) -> tuple[int, int]:
        """The canvas a t2va request without a size gets (diffusers' 16:9 default, 768x1344 for the real model)."""
        host = self._host  # the full pipeline over the folder's index: it carries the canvas configs
        return resolve_canvas_size(16, 9, host.canvas_multiple, host.config.canvas_short_edge,
                                   host.config.canvas_max_pixels)

    def encode_inputs(self, req: ValidEncode) -> dict:
        """The keyword inputs of the encode blocks for a validated request."""
        inputs = {"prompt": req.prompt, "height": req.height, "width": req.width, "num_frames": req.num_frames}
        if req.workflow == "fl2va":
            inputs["image"] = req.first_image
            inputs["last_image"] = req.last_image
        elif req.workflow == "ref2va":
            refs = [MiniMaxH3ImageReference(image=im) for im in req.reference_images]
            if req.reference_audio is not None:  # at the audio VAE's rate already: diffusers resamples nothing
                clip, rate = req.reference_audio, self.audio_rate
                wave = resample_audio(clip.waveform, clip.sample_rate, rate)
                refs.append(MiniMaxH3AudioReference(audio=torch.from_numpy(wave), sample_rate=rate))
            inputs["references"] = refs
        return inputs

    # ------------------------------------------------------------------------------------------------ encode
    def encode(self, request: EncodeRequest | ValidEncode) -> wire.EncodedRequest:
        """The conditioning of one request (no denoise parameters: those travel with each denoise call)."""
        req = request if isinstance(request, ValidEncode) else validate_encode(request)
        if req.workflow == "t2va" and req.height is None:
            req = req.with_canvas(*self.default_canvas())
        with self._use:
            self.ensure(NEEDS["encode"])
            pipe = self._pipe(req.workflow, "encode")
            accepted = self._accepts[(req.workflow, "encode")]
            with maybe_profile(f"encode_{req.request_id}", self.device.startswith("cuda")):
                state = pipe(**{k: v for k, v in self.encode_inputs(req).items() if k in accepted})
        get = state.get
        height = get("height") if get("height") is not None else req.height
        width = get("width") if get("width") is not None else req.width
        num_frames = get("num_frames") if get("num_frames") is not None else req.num_frames
        refs = get("normalized_references") or []
        payload = wire.EncodedRequest(
            request_id=req.request_id,
            workflow=req.workflow,
            height=int(height),
            width=int(width),
            num_frames=int(num_frames),
            prompt_embeds=wire.WireTensor.from_torch(get("prompt_embeds")),
            text_token_tags=wire.WireTensor.from_torch(get("text_token_tags").to(torch.int64)),
            keyframe_anchors=tuple(get("keyframe_anchors") or ()) if req.workflow == "fl2va" else (),
            condition_latents=tuple(wire.WireTensor.from_torch(t) for t in (get("condition_latents") or ())),
            audio_condition_latents=tuple(
                wire.WireTensor.from_torch(t) for t in (get("audio_condition_latents") or ())
            ),
            references=tuple(wire.ReferenceMeta(r.kind, bool(r.has_audio)) for r in refs),
        )
        return payload.validate()

    # ------------------------------------------------------------------------------------------------ decode
    def decode_raw(self, latents: wire.DenoisedLatents, output_type: str = "np", validated: bool = False) -> dict:
        """diffusers' decode outputs (``videos``, ``audio``, ``sampling_rate``); ``validated=True`` when the
        receiver already validated ``latents`` (it times that apart from the transfer)."""
        if not validated:
            latents.validate()
        with self._use:
            self.ensure(NEEDS["decode"])
            pipe = self._pipe(latents.workflow, "decode")
            with self._decode_lock, maybe_profile(f"decode_{latents.request_id}", self.device.startswith("cuda")):
                return pipe(latents=latents.latents.to_torch().to(self.device),
                            audio_latents=latents.audio_latents.to_torch().to(self.device),
                            output_type=output_type, output=["videos", "audio", "sampling_rate"])

    def decode(self, latents: wire.DenoisedLatents, validated: bool = False) -> DecodedMedia:
        t0 = time.perf_counter()
        out = self.decode_raw(latents, "pt", validated)
        return self._media(latents, out, t0)

    def _media(self, latents: wire.DenoisedLatents, out: dict, t0: float) -> DecodedMedia:
        frames = frames_hwc(out["videos"])
        audio = out["audio"]
        audio = audio.detach().float().cpu().numpy() if hasattr(audio, "detach") else np.asarray(audio)
        if audio.ndim == 3:
            audio = audio[0]
        return DecodedMedia(latents.request_id, frames, audio, int(out["sampling_rate"]),
                            timings={"decode_s": time.perf_counter() - t0})

    # ------------------------------------------------------------------------------------------------ split decode
    @property
    def vae(self):
        """The resident video VAE (reloaded first when it was released)."""
        with self._use:
            self.ensure(("vae",))
            return self._host.vae

    def decoder_info(self) -> dict:
        """What the executor's split-decode policy compares with B's (same weights, same dtype), and the geometry."""
        if getattr(self, "_vae_fingerprint", None) is None:
            vae = self.parts.get("vae")
            self._vae_fingerprint = (split_decode.vae_fingerprint(self.model_dir / "vae") if vae is None
                                     else f"file:{vae.path.name}:{vae.path.stat().st_size}")
        return {"resident": True, "dtype": self.dtype, "fingerprint": self._vae_fingerprint, **self._geometry}

    def num_clips(self, latents: wire.DenoisedLatents) -> int:
        return split_decode.clips_for(self._geometry, latents.latents.shape[2])

    def decode_share(self, latents: wire.DenoisedLatents, start: int, stop: int,
                     should_cancel: Callable[[], bool] | None = None, first_tile: int = 0) -> split_decode.Share:
        """Clips ``[start, stop)`` decoded with A's VAE (what B's share computes on B)."""
        with self._use, self._decode_lock:
            return split_decode.decode_share(self.vae, latents.latents.to_torch(), start, stop, should_cancel,
                                             first_tile)

    def decode_split(self, latents: wire.DenoisedLatents, provider: Callable[[int], object | None],
                     should_cancel: Callable[[], bool] | None = None,
                     validated: bool = False) -> tuple[DecodedMedia, split_decode.ServeLog]:
        """diffusers' decode blocks with each clip from ``provider(i)`` (B's share), or decoded here when it returns
        ``None`` (A's share, or B's clips when B's share was lost); frames identical to :meth:`decode`."""
        if not validated:
            latents.validate()
        t0 = time.perf_counter()
        with self._use:
            self.ensure(NEEDS["decode"])
            pipe = self._pipe(latents.workflow, "decode")
            lat = latents.latents.to_torch().to(self.device)  # the wire's host tensors: diffusers' decode needs them
            with self._decode_lock, split_decode.serve_clips(self.vae, lat, provider, should_cancel) as log, \
                    maybe_profile(f"decode_{latents.request_id}", self.device.startswith("cuda")):
                out = pipe(latents=lat, audio_latents=latents.audio_latents.to_torch().to(self.device),
                           output_type="pt", output=["videos", "audio", "sampling_rate"])
        return self._media(latents, out, t0), log

    # ------------------------------------------------------------------------------------------------ records
    def encode_recorded(self, request: EncodeRequest | ValidEncode, node: str) -> tuple[wire.EncodedRequest,
                                                                                         StageRecord]:
        """:meth:`encode` and its record (the canvas it encoded in ``info``)."""
        w0, t0 = time.time(), time.perf_counter()
        payload = self.encode(request)
        return payload, StageRecord(payload.request_id, "encode", "A", node, w0, time.time(),
                                    compute_s=time.perf_counter() - t0, bytes=payload.field_bytes(),
                                    info={"height": payload.height, "width": payload.width,
                                          "num_frames": payload.num_frames, "workflow": payload.workflow})

    def decode_recorded(self, latents: wire.DenoisedLatents, node: str,
                        validated: bool = False) -> tuple[DecodedMedia, StageRecord]:
        """:meth:`decode` and its record (A's decode, on this machine's clock)."""
        w0, t0 = time.time(), time.perf_counter()
        media = self.decode(latents, validated)
        return media, StageRecord(latents.request_id, "decode", "A", node, w0, time.time(),
                                  compute_s=time.perf_counter() - t0, bytes=_media_bytes(media))

    def decode_split_recorded(self, latents: wire.DenoisedLatents, share, should_cancel: Callable[[], bool],
                              node: str, validated: bool = False) -> tuple[DecodedMedia, list[StageRecord]]:
        """:meth:`decode_split` with ``share`` (a :class:`~..executor.handoff.ShareReceiver` of B's clips) and its
        records: A's (its clips, the blend, B's frames' wait, fetch and materialisation), then B's own when B's share
        arrived. The note says what ran where, and when A decoded B's clips itself."""
        w0 = time.time()
        media, served = self.decode_split(latents, share, should_cancel, validated)
        n, b0, b_tile = served.clips, share.start, share.first_tile
        a_clips = [i for i in served.decoded if i < b0]
        took_over = [i for i in served.decoded if i >= b0 and i not in served.partial]
        tiles = split_decode.tiles_for(self._geometry, latents.height, latents.width)
        note = f"split decode: A clips {_span(a_clips)}, B clips {_span(list(range(b0, n)))} of {n}"
        if b_tile:
            note += f" (clip {b0}: A tiles 0-{b_tile - 1}, B tiles {b_tile}-{tiles - 1})"
        if took_over:
            note += f"; B's share was lost ({share.failure}): A decoded B's clips {_span(took_over)} itself"
        # B's frames crossed in the background; the blend waited only for the part not hidden behind A's clips
        compute = media.timings["decode_s"] - share.producer_wait_s - share.fetch_wait_s - share.materialize_s
        a_rec = StageRecord(latents.request_id, "decode", "A", node, w0, time.time(),
                            producer_wait_s=share.producer_wait_s, fetch_s=share.fetch_s,
                            materialize_s=share.materialize_s, compute_s=max(compute, 0.0),
                            bytes={**_media_bytes(media), "b_frames": int(share.bytes)}, note=note,
                            info={"decode_on": "A+B", "clips": n, "a_clips": [0, b0], "b_clips": [b0, n],
                                  "b_tile": b_tile, "tiles": tiles,
                                  "a_decoded": list(served.decoded), "b_received": list(share.received),
                                  "a_clip_s": [round(x, 5) for x in served.decoded_s], "b_lost": share.failure,
                                  "b_frames_wait_s": round(share.fetch_wait_s, 4)})
        return media, [a_rec] + ([share.record] if share.record is not None else [])


def frames_hwc(videos) -> np.ndarray:
    """diffusers' ``pt`` decode output ``(1, F, 3, H, W)`` as the frames of its ``np`` output: ``[F, H, W, 3]`` float32,
    the same values. torch lays them out in 0.2-0.3 s for 124 frames of 640x384 on one core, numpy's ``np.stack`` of
    the strided view (the ``np`` output) in 1.0-1.5 s, all of it on A after both machines' clips."""
    return videos[0].permute(0, 2, 3, 1).float().contiguous().cpu().numpy()


def _media_bytes(media: DecodedMedia) -> dict:
    return {"frames": int(media.frames.nbytes), "audio": int(media.audio.nbytes)}


def _span(clips: list) -> str:
    return f"{clips[0]}-{clips[-1]}" if len(clips) > 1 else f"{clips[0]}" if clips else "none"
