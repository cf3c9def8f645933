"""The A side: text/reference encoding and VAE decode on resident models, built from diffusers' own blocks.

A loads only ``text_encoder``, ``tokenizer``, ``processor``, ``vae`` and ``audio_vae``. ``encode`` runs the A-encode
blocks of the request's workflow and packs what B needs into an :class:`~.wire.EncodedRequest`; ``decode`` runs the
``decode.*`` blocks on a :class:`~.wire.DenoisedLatents`; ``decode_split`` runs the same blocks with the last clips
taken from B's share (:mod:`.split_decode`). The Ray actor of the executor wraps this class.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..model import memory_plan, split, split_decode
from ..contract import wire
from ..model.backends import resolve_attention_backend
from ..process_profiling import maybe_profile
from ..contract.request import H3Request, ValidRequest, validate_request


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

    def __init__(self, model_dir: str | os.PathLike, dtype: str = "bfloat16", attention_backend: str = "sdpa",
                 device: str | None = None, memory_limit_bytes: int | None = None):
        import torch

        self.attention_backend = resolve_attention_backend(attention_backend)
        self.device = split.pick_device(device)
        self.dtype = dtype
        self.model_dir = split.check_model_dir(model_dir, split.A_COMPONENTS)
        # the text encoder and VAEs at this dtype + decode working memory, against what A has: refused before loading
        self.memory_plan = memory_plan.plan_a(self.model_dir, split.MODEL_COMPONENTS_A, dtype, self.device,
                                              limit_bytes=memory_limit_bytes).check()
        loaded = split.load_checked(self.model_dir, split.A_COMPONENTS, dtype, self.device)
        self._host = loaded.host
        self.load_records = loaded.records
        self._pipes: dict[tuple[str, str], object] = {}
        self._accepts: dict[tuple[str, str], set[str]] = {}
        self._torch = torch
        self._decode_lock = threading.Lock()  # one decode at a time: a split decode overrides a method of the VAE
        #: benchmark only (``bench batch``): seconds ``encode``/``decode`` sleep on top of their real work
        self.synthetic_stages: dict = {}

    # ------------------------------------------------------------------------------------------------ helpers
    def _pipe(self, workflow: str, part: str):
        key = (workflow, part)
        if key not in self._pipes:
            blocks = split.split_workflow(workflow)[part]
            self._accepts[key] = {p.name for p in blocks.inputs if p.name}
            self._pipes[key] = split.make_group_pipeline(blocks, self.model_dir, self._host, split.A_COMPONENTS)
        return self._pipes[key]

    def resident(self) -> dict[str, str]:
        return {n: type(getattr(self._host, n)).__name__ for n in split.A_COMPONENTS}

    def default_canvas(self) -> tuple[int, int]:
        """The canvas a t2va request without a size gets (diffusers' 16:9 default, 768x1344 for the real model)."""
        from diffusers.modular_pipelines.minimax_h3.modular_pipeline import resolve_canvas_size

        host = self._host  # the full pipeline over the folder's index: it carries the canvas configs
        return resolve_canvas_size(16, 9, host.canvas_multiple, host.config.canvas_short_edge,
                                   host.config.canvas_max_pixels)

    def encode_inputs(self, req: ValidRequest) -> dict:
        """The keyword inputs of the encode blocks for a validated request."""
        inputs = {"prompt": req.prompt, "height": req.height, "width": req.width, "num_frames": req.num_frames}
        if req.workflow == "fl2va":
            inputs["image"] = req.first_image
            inputs["last_image"] = req.last_image
        elif req.workflow == "ref2va":
            from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3AudioReference, MiniMaxH3ImageReference

            refs = [MiniMaxH3ImageReference(image=im) for im in req.reference_images]
            if req.reference_audio is not None:
                refs.append(MiniMaxH3AudioReference(audio=self._torch.from_numpy(req.reference_audio.waveform),
                                                    sample_rate=req.reference_audio.sample_rate))
            inputs["references"] = refs
        return inputs

    # ------------------------------------------------------------------------------------------------ encode
    def encode(self, request: H3Request | ValidRequest) -> wire.EncodedRequest:
        req = request if isinstance(request, ValidRequest) else validate_request(request)
        if req.workflow == "t2va" and req.height is None:
            req = req.with_canvas(*self.default_canvas())
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
            num_inference_steps=req.steps,
            seed=req.seed,
            prompt_embeds=wire.WireTensor.from_torch(get("prompt_embeds")),
            text_token_tags=wire.WireTensor.from_torch(get("text_token_tags").to(self._torch.int64)),
            keyframe_anchors=tuple(get("keyframe_anchors") or ()) if req.workflow == "fl2va" else (),
            condition_latents=tuple(wire.WireTensor.from_torch(t) for t in (get("condition_latents") or ())),
            audio_condition_latents=tuple(
                wire.WireTensor.from_torch(t) for t in (get("audio_condition_latents") or ())
            ),
            references=tuple(wire.ReferenceMeta(r.kind, bool(r.has_audio)) for r in refs),
            adapters=tuple(wire.AdapterSpec(p, w) for p, w in req.adapters),
        )
        self._synthetic("encode")
        return payload.validate()

    # ------------------------------------------------------------------------------------------------ decode
    def decode_raw(self, latents: wire.DenoisedLatents, output_type: str = "np", validated: bool = False) -> dict:
        """diffusers' decode outputs (``videos``, ``audio``, ``sampling_rate``); ``validated=True`` when the
        receiver already validated ``latents`` (it times that apart from the transfer)."""
        if not validated:
            latents.validate()
        pipe = self._pipe(latents.workflow, "decode")
        with self._decode_lock, maybe_profile(f"decode_{latents.request_id}", self.device.startswith("cuda")):
            return pipe(latents=latents.latents.to_torch(), audio_latents=latents.audio_latents.to_torch(),
                        output_type=output_type, output=["videos", "audio", "sampling_rate"])

    def decode(self, latents: wire.DenoisedLatents, validated: bool = False) -> DecodedMedia:
        t0 = time.perf_counter()
        out = self.decode_raw(latents, "np", validated)
        self._synthetic("decode")
        return self._media(latents, out, t0)

    def _synthetic(self, stage: str) -> None:
        seconds = float(self.synthetic_stages.get(stage, 0.0))
        if seconds > 0:
            time.sleep(seconds)

    def _media(self, latents: wire.DenoisedLatents, out: dict, t0: float) -> DecodedMedia:
        frames = np.asarray(out["videos"][0], dtype=np.float32)
        audio = out["audio"]
        audio = audio.detach().float().cpu().numpy() if hasattr(audio, "detach") else np.asarray(audio)
        if audio.ndim == 3:
            audio = audio[0]
        return DecodedMedia(latents.request_id, frames, audio, int(out["sampling_rate"]),
                            timings={"decode_s": time.perf_counter() - t0})

    # ------------------------------------------------------------------------------------------------ split decode
    @property
    def vae(self):
        return self._host.vae

    def decoder_info(self) -> dict:
        """What the executor's split-decode policy compares with B's (same weights, same dtype), and the geometry."""
        if getattr(self, "_vae_fingerprint", None) is None:
            self._vae_fingerprint = split_decode.vae_fingerprint(self.model_dir / "vae")
        return {"resident": True, "dtype": self.dtype, "fingerprint": self._vae_fingerprint,
                **split_decode.geometry(self.vae)}

    def num_clips(self, latents: wire.DenoisedLatents) -> int:
        return split_decode.num_clips(self.vae, latents.latents.shape[2])

    def decode_share(self, latents: wire.DenoisedLatents, start: int, stop: int,
                     should_cancel: Callable[[], bool] | None = None) -> split_decode.Share:
        """Clips ``[start, stop)`` decoded with A's VAE (what B's share computes on B)."""
        with self._decode_lock:
            return split_decode.decode_share(self.vae, latents.latents.to_torch(), start, stop, should_cancel)

    def decode_split(self, latents: wire.DenoisedLatents, provider: Callable[[int], object | None],
                     should_cancel: Callable[[], bool] | None = None,
                     validated: bool = False) -> tuple[DecodedMedia, split_decode.ServeLog]:
        """diffusers' decode blocks with each clip from ``provider(i)`` (B's share), or decoded here when it returns
        ``None`` (A's share, or B's clips when B's share was lost); frames identical to :meth:`decode`."""
        if not validated:
            latents.validate()
        t0 = time.perf_counter()
        pipe = self._pipe(latents.workflow, "decode")
        lat = latents.latents.to_torch()
        with self._decode_lock, split_decode.serve_clips(self.vae, lat, provider, should_cancel) as log, \
                maybe_profile(f"decode_{latents.request_id}", self.device.startswith("cuda")):
            out = pipe(latents=lat, audio_latents=latents.audio_latents.to_torch(), output_type="np",
                       output=["videos", "audio", "sampling_rate"])
        return self._media(latents, out, t0), log
