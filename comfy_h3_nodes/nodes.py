"""ComfyUI nodes (classic V1 API: plain classes, no ComfyUI import). Thin: they translate ComfyUI values to the
engine and back, and report each node's timing record; everything else is the engine's.

Graph: H3LoadEncoders -> H3TextEncode (+ H3Keyframes | H3References) -> H3RemoteDenoise (+ H3RemoteDiT) -> H3Decode
-> H3SaveVideo (or ComfyUI's own CreateVideo/SaveVideo: H3Decode returns standard IMAGE and AUDIO).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from .engine import request as rq
from .engine.backends import UI_CHOICES
from .engine.split import DTYPES, PARTITIONS
from .engine.timing import StageRecord

log = logging.getLogger("comfy_h3.nodes")

CATEGORY = "MiniMax-H3"
DEFAULT_MODEL_PATH = "/models/MiniMax-H3"
MAX_SEED = rq.MAX_SEED


# ------------------------------------------------------------------------------------------------ values
@dataclasses.dataclass
class Keyframes:
    first: object = None
    last: object = None


@dataclasses.dataclass
class References:
    images: list
    audio: rq.AudioClip | None = None


@dataclasses.dataclass
class Conditioning:
    """H3_CONDITIONING: the encoded request, held on A (this process) as numpy; never lost with the cluster."""

    payload: object  # wire.EncodedRequest
    record: StageRecord
    uses: int = 0  # denoise runs so far: the first keeps the encode's request id, so a timeline joins them

    def next_request_id(self) -> str:
        self.uses += 1
        rid = self.payload.request_id
        return rid if self.uses == 1 else f"{rid}.{self.uses}"


@dataclasses.dataclass(frozen=True)
class LoRAStack:
    """H3_DIT with LoRA adapters: the same resident DiT, plus the adapters every request through it asks for."""

    executor: object
    adapters: tuple = ()


def dit_parts(dit) -> tuple[object, tuple]:
    if isinstance(dit, LoRAStack):
        return dit.executor, dit.adapters
    return dit, ()


@dataclasses.dataclass
class Latents:
    """H3_LATENTS: B's denoised latents, already received on A (so a cached value survives a cluster restart)."""

    payload: object  # wire.DenoisedLatents
    records: list


# ------------------------------------------------------------------------------------------------ helpers
def _host():
    from .host import host

    return host()


def _summary(records: list[StageRecord], compute_stage: str) -> dict:
    by = {r.stage: r for r in records}
    out = {"compute_s": sum(r.compute_s for r in records if r.stage == compute_stage),
           "machine": by[compute_stage].machine if compute_stage in by else "A", "a_to_b": None, "b_to_a": None}
    for stage in ("a_to_b", "b_to_a"):
        r = by.get(stage)
        if r is not None:
            out[stage] = {"producer_wait_s": r.producer_wait_s, "fetch_s": r.fetch_s,
                          "materialize_s": r.materialize_s, "validate_s": r.validate_s,
                          "serialize_s": r.serialize_s, "bytes": r.total_bytes}
    if "denoise" in by:
        out["steps_done"] = len(by["denoise"].steps)
    return out


def report(node_type: str, unique_id, records: list[StageRecord], compute_stage: str, extra: dict | None = None,
           ui: dict | None = None) -> dict:
    """Send ``h3.timing``, keep the records for ``/h3/timings``, and return the ``ui`` dict of the node."""
    from .engine import session

    h = _host()
    payload = {
        "prompt_id": h.prompt_id(),
        "node": None if unique_id is None else str(unique_id),
        "node_type": node_type,
        "request_id": next((r.request_id for r in records if r.request_id), None),
        "stages": [r.to_dict() for r in records],
        "summary": {**_summary(records, compute_stage), **(extra or {})},
    }
    session.TIMINGS.add(records)
    h.send_event("h3.timing", payload)
    out = dict(ui or {})
    out["h3_timing"] = [payload]
    return out


def _local_record(stage: str, t0: float, w0: float, request_id: str = "", **kw) -> StageRecord:
    return StageRecord(request_id, stage, "A", _node_ip(), w0, time.time(), compute_s=time.perf_counter() - t0, **kw)


def _node_ip() -> str:
    import sys

    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    import socket

    return socket.gethostname()


def _image_list(images) -> list:
    """A ComfyUI IMAGE batch [B,H,W,C] -> list of [H,W,C] float arrays (validated by the engine)."""
    if images is None:
        return []
    arr = images.detach().cpu().numpy() if hasattr(images, "detach") else images
    if getattr(arr, "ndim", 0) == 3:
        return [arr]
    if getattr(arr, "ndim", 0) != 4:
        raise rq.RequestError(f"IMAGE has shape {tuple(getattr(arr, 'shape', ()))}; expected [batch, H, W, 3].")
    return [arr[i] for i in range(arr.shape[0])]


def _audio_clip(audio) -> rq.AudioClip | None:
    if audio is None:
        return None
    if not isinstance(audio, dict) or "waveform" not in audio or "sample_rate" not in audio:
        raise rq.RequestError("AUDIO must be ComfyUI's {'waveform': [B,C,L], 'sample_rate': int}.")
    wf = audio["waveform"]
    wf = wf.detach().cpu().float().numpy() if hasattr(wf, "detach") else wf
    if getattr(wf, "ndim", 0) == 3:
        if wf.shape[0] != 1:
            raise rq.RequestError(f"AUDIO reference holds a batch of {wf.shape[0]} clips; give one.")
        wf = wf[0]
    return rq.check_audio(rq.AudioClip(wf, int(audio["sample_rate"])), "AUDIO reference")


def _canvas_errors(width: int, height: int) -> str | None:
    if width == 0 and height == 0:
        return None
    try:
        rq.check_canvas(height, width)
    except rq.RequestError as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------------------------------------ nodes
class H3LoadEncoders:
    DESCRIPTION = "Loads MiniMax-H3's Qwen3-VL text encoder, video VAE and audio VAE on this machine (A), once."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_ENCODERS",)
    RETURN_NAMES = ("encoders",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model_path": ("STRING", {"default": DEFAULT_MODEL_PATH,
                                      "tooltip": "diffusers MiniMax-H3 folder on A (modular_model_index.json)"}),
            "dtype": (list(DTYPES), {"default": "bfloat16"}),
            "attention_backend": (list(UI_CHOICES), {"default": "sdpa"}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    def load(self, model_path, dtype, attention_backend, unique_id=None):
        from .engine import session

        t0, w0 = time.perf_counter(), time.time()
        enc, loaded_now = session.encoders(model_path, dtype, attention_backend)
        loads = sum(r.seconds for r in enc.load_records) if loaded_now else 0.0
        rec = _local_record("load", t0, w0, load_s=loads,
                            note=("loaded" if loaded_now else "resident") + f": {', '.join(enc.resident())}")
        return {"ui": report("H3LoadEncoders", unique_id, [rec], "load"), "result": (enc,)}


class H3RemoteDiT:
    DESCRIPTION = ("Connects to the resident MiniMax-H3 DiT on machine B (a named Ray actor); 'local' starts a "
                   "two-node Ray cluster on this machine. Checks topology and health on every run.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_DIT",)
    RETURN_NAMES = ("dit",)
    FUNCTION = "connect"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "cluster_address": ("STRING", {"default": "local", "tooltip": "'local' or the Ray head host:port"}),
            "actor_name": ("STRING", {"default": "h3_dit"}),
            "namespace": ("STRING", {"default": "comfy_h3"}),
            "model_path": ("STRING", {"default": DEFAULT_MODEL_PATH, "tooltip": "model folder on machine B"}),
            "partition": (list(PARTITIONS), {"default": "transformer"}),
            "dtype": (list(DTYPES), {"default": "bfloat16"}),
            "attention_backend": (list(UI_CHOICES), {"default": "sdpa"}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")  # re-check topology and health on every run

    # No **kwargs in any VALIDATE_INPUTS: ComfyUI skips its own min/max and combo checks for every input a
    # VALIDATE_INPUTS names, and for all of them when it takes **kwargs. A linked input arrives as None.
    @classmethod
    def VALIDATE_INPUTS(cls, cluster_address=None, actor_name=None):
        if cluster_address is not None:
            addr = cluster_address.strip()
            if addr != "local" and (":" not in addr or not addr.rsplit(":", 1)[1].isdigit()):
                return f"cluster_address {cluster_address!r} must be 'local' or host:port (e.g. 192.168.100.1:6379)."
        if actor_name is not None and not actor_name.strip():
            return "actor_name is empty; use the name `remote_worker setup` printed (default h3_dit)."
        return True

    def connect(self, cluster_address, actor_name, namespace, model_path, partition, dtype, attention_backend,
                unique_id=None):
        from .engine import session

        t0, w0 = time.perf_counter(), time.time()
        ex = session.dit(cluster_address.strip(), actor_name.strip(), namespace.strip(), model_path, partition,
                         dtype, attention_backend)
        health = ex.last_health  # session.dit has just checked it (on start, or on reuse)
        b = health["B"]
        rec = StageRecord("", "connect", "B", b["node_ip"], w0, time.time(), compute_s=time.perf_counter() - t0,
                          note=f"A {ex.topology.a.ip} · B {b['node_ip']} ({b['device']}, {b['partition']})")
        ui = report("H3RemoteDiT", unique_id, [rec], "connect",
                    extra={"a_node": ex.topology.a.ip, "b_node": b["node_ip"], "b_device": b["device"],
                           "partition": b["partition"], "clock_b_minus_a_s": health["clock"]["b_minus_a_s"]})
        _host().progress_text(rec.note, unique_id)
        return {"ui": ui, "result": (ex,)}


class H3LoRA:
    DESCRIPTION = ("Adds a LoRA adapter (a .safetensors file on machine B, inside its model roots) with a strength. "
                   "Chain several to stack them. The base DiT stays resident; B switches adapters per request.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_DIT",)
    RETURN_NAMES = ("dit",)
    FUNCTION = "apply"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "dit": ("H3_DIT",),
            "lora_path": ("STRING", {"default": "/models/loras/h3_turbo_4step.safetensors",
                                     "tooltip": "path on machine B"}),
            "strength": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.05}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def VALIDATE_INPUTS(cls, lora_path=None, strength=None):
        if lora_path is not None and strength is not None:
            try:
                rq.check_adapters([(lora_path, strength)])
            except rq.RequestError as exc:
                return str(exc)
        return True

    def apply(self, dit, lora_path, strength, unique_id=None):
        t0, w0 = time.perf_counter(), time.time()
        ex, adapters = dit_parts(dit)
        adapters = rq.check_adapters([*adapters, (lora_path, strength)])
        rec = _local_record("lora", t0, w0, note=", ".join(f"{p} x{w:g}" for p, w in adapters))
        return {"ui": report("H3LoRA", unique_id, [rec], "lora", extra={"adapters": [list(a) for a in adapters]}),
                "result": (LoRAStack(ex, adapters),)}


class H3Keyframes:
    DESCRIPTION = "First and/or last keyframe for MiniMax-H3's fl2va workflow."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_KEYFRAMES",)
    RETURN_NAMES = ("keyframes",)
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}, "optional": {"first_image": ("IMAGE",), "last_image": ("IMAGE",)},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    def make(self, first_image=None, last_image=None, unique_id=None):
        t0, w0 = time.perf_counter(), time.time()
        if first_image is None and last_image is None:
            raise rq.RequestError("H3Keyframes has no image connected; connect first_image, last_image or both.")
        first = rq.to_pil_rgb(_image_list(first_image)[0], "first_image") if first_image is not None else None
        last = rq.to_pil_rgb(_image_list(last_image)[0], "last_image") if last_image is not None else None
        rec = _local_record("keyframes", t0, w0)
        return {"ui": report("H3Keyframes", unique_id, [rec], "keyframes"), "result": (Keyframes(first, last),)}


class H3References:
    DESCRIPTION = "Image references (a batch; at most 9) and an optional audio reference for the ref2va workflow."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_REFERENCES",)
    RETURN_NAMES = ("references",)
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",)}, "optional": {"audio": ("AUDIO",)},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    def make(self, images, audio=None, unique_id=None):
        t0, w0 = time.perf_counter(), time.time()
        imgs = _image_list(images)
        if len(imgs) > rq.MAX_IMAGE_REFERENCES:
            raise rq.RequestError(f"{len(imgs)} image references were given; MiniMax-H3 reads at most "
                                  f"{rq.MAX_IMAGE_REFERENCES}: drop {len(imgs) - rq.MAX_IMAGE_REFERENCES}.")
        pil = [rq.to_pil_rgb(im, f"reference image {i}") for i, im in enumerate(imgs)]
        rec = _local_record("references", t0, w0)
        return {"ui": report("H3References", unique_id, [rec], "references"),
                "result": (References(pil, _audio_clip(audio)),)}


class H3TextEncode:
    DESCRIPTION = ("Encodes the prompt (and keyframes or references) on A. The workflow follows from what is "
                   "connected: nothing = t2va, keyframes = fl2va, references = ref2va. width/height 0 = automatic.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_CONDITIONING",)
    RETURN_NAMES = ("conditioning",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "encoders": ("H3_ENCODERS",),
            "prompt": ("STRING", {"multiline": True, "default": ""}),
            "width": ("INT", {"default": 832, "min": 0, "max": 4096, "step": 32}),
            "height": ("INT", {"default": 480, "min": 0, "max": 4096, "step": 32}),
            "num_frames": ("INT", {"default": 124, "min": 1, "max": 1000,
                                   "tooltip": "at 24 fps; snapped up to 17n+5; 124..345 (5-15 s)"}),
        }, "optional": {"keyframes": ("H3_KEYFRAMES",), "references": ("H3_REFERENCES",)},
            "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def VALIDATE_INPUTS(cls, width=None, height=None, num_frames=None, prompt=None):
        if isinstance(width, int) and isinstance(height, int):
            if (width == 0) != (height == 0):
                return f"width {width} and height {height}: set both to 0 (automatic) or both to a size."
            err = _canvas_errors(width, height)
            if err:
                return err
        if num_frames is not None:
            try:
                rq.check_frames(num_frames)
            except rq.RequestError as exc:
                return str(exc)
        if isinstance(prompt, str):
            try:
                rq.check_prompt(prompt)
            except rq.RequestError as exc:
                return str(exc)
        return True

    def encode(self, encoders, prompt, width, height, num_frames, keyframes=None, references=None, unique_id=None):
        t0, w0 = time.perf_counter(), time.time()
        req = rq.H3Request(prompt=prompt, height=height or None, width=width or None, num_frames=num_frames,
                           steps=1, seed=0)
        if keyframes is not None:
            req.first_image, req.last_image = keyframes.first, keyframes.last
        if references is not None:
            req.reference_images, req.reference_audio = list(references.images), references.audio
        payload = encoders.encode(req)
        rec = StageRecord(payload.request_id, "encode", "A", _node_ip(), w0, time.time(),
                          compute_s=time.perf_counter() - t0, bytes=payload.field_bytes())
        extra = {"workflow": payload.workflow, "canvas": f"{payload.width}x{payload.height}",
                 "num_frames": payload.num_frames}
        return {"ui": report("H3TextEncode", unique_id, [rec], "encode", extra=extra),
                "result": (Conditioning(payload, rec),)}


class H3RemoteDenoise:
    DESCRIPTION = ("Denoises on machine B: sends the conditioning A->B, follows B's steps on the progress bar, "
                   "brings the latents B->A. ComfyUI's interrupt stops B within one step.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_LATENTS",)
    RETURN_NAMES = ("latents",)
    FUNCTION = "denoise"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "dit": ("H3_DIT",),
            "conditioning": ("H3_CONDITIONING",),
            "seed": ("INT", {"default": 0, "min": 0, "max": MAX_SEED, "control_after_generate": True}),
            "steps": ("INT", {"default": 50, "min": 1, "max": rq.MAX_STEPS,
                              "tooltip": "sigma points; 50 for the base model (49 forwards)"}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def VALIDATE_INPUTS(cls, seed=None, steps=None):
        try:
            if steps is not None:
                rq.check_steps(steps)
            if seed is not None:
                rq.check_seed(seed)
        except rq.RequestError as exc:
            return str(exc)
        return True

    async def denoise(self, dit, conditioning, seed, steps, unique_id=None):
        from .engine import wire
        from .engine.executor import H3Cancelled

        h = _host()
        rq.check_steps(steps)
        rq.check_seed(seed)
        dit, adapters = dit_parts(dit)
        rid = conditioning.next_request_id()
        payload = dataclasses.replace(conditioning.payload, request_id=rid, seed=int(seed),
                                      num_inference_steps=int(steps),
                                      adapters=tuple(wire.AdapterSpec(p, w) for p, w in adapters))
        bar = h.progress(unique_id, max(1, steps - 1), "B denoise")
        loop = asyncio.get_running_loop()

        def on_step(ev):  # runs on the executor's thread
            try:
                bar.update(ev.index + 1, ev.total)
            except Exception as exc:  # noqa: BLE001 - ComfyUI's progress hook raises once the user interrupted
                log.info("progress update raised %s: cancelling request %s on B", type(exc).__name__, rid)
                dit.cancel(rid)
            try:
                h.send_event("h3.progress", {"prompt_id": h.prompt_id(), "node": str(unique_id),
                                             "request_id": rid, "step": ev.index + 1, "total": ev.total,
                                             "seconds": ev.seconds})
            except Exception as exc:  # noqa: BLE001 - a UI that went away must not stop the denoise
                log.warning("could not send h3.progress: %s", exc)

        w0, t0 = time.time(), time.perf_counter()
        enc = dit.put_payload(payload, w0, 0.0)
        fut = asyncio.wrap_future(dit.submit_denoise(enc, on_step))
        try:
            while True:
                done, _ = await asyncio.wait({fut}, timeout=0.1)
                if done:
                    break
                if h.interrupted():
                    dit.cancel(rid)
                    try:
                        await fut
                    except H3Cancelled:
                        pass
                    raise _interrupt_exception()
            den = fut.result()
            del enc
            latents, b_to_a = await loop.run_in_executor(None, dit.receive_local, den)
        finally:
            bar.close()
        records = [*den.records, b_to_a]
        forwards = len(den.records[1].steps)
        extra = {"steps_total": forwards, "schedule": f"{steps} sigma points: {den.records[1].note}",
                 "total_s": time.perf_counter() - t0}
        ui = report("H3RemoteDenoise", unique_id, records, "denoise", extra=extra)
        h.progress_text(extra["schedule"], unique_id)
        return {"ui": ui, "result": (Latents(latents, records),)}


def _interrupt_exception():
    from .host import host

    h = host()
    if getattr(h, "name", "") == "comfyui":
        import comfy.model_management

        return comfy.model_management.InterruptProcessingException()
    from .engine.executor import H3Cancelled

    return H3Cancelled("interrupted: the request was cancelled on B")


class H3Decode:
    DESCRIPTION = "Decodes B's latents on A into frames (IMAGE) and stereo sound (AUDIO), plus the frame rate."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE", "AUDIO", "INT")
    RETURN_NAMES = ("images", "audio", "fps")
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"encoders": ("H3_ENCODERS",), "latents": ("H3_LATENTS",)},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    def decode(self, encoders, latents, unique_id=None):
        import torch

        t0, w0 = time.perf_counter(), time.time()
        media = encoders.decode(latents.payload)
        images = torch.from_numpy(media.frames)
        audio = {"waveform": torch.from_numpy(media.audio).unsqueeze(0), "sample_rate": media.sample_rate}
        rec = StageRecord(latents.payload.request_id, "decode", "A", _node_ip(), w0, time.time(),
                          compute_s=time.perf_counter() - t0,
                          bytes={"frames": int(media.frames.nbytes), "audio": int(media.audio.nbytes)})
        ui = report("H3Decode", unique_id, [rec], "decode",
                    extra={"frames": int(media.frames.shape[0]), "sample_rate": media.sample_rate})
        return {"ui": ui, "result": (images, audio, media.fps)}


class H3SaveVideo:
    DESCRIPTION = "Writes an MP4 (H.264 + AAC) with the prompt and workflow JSON in its metadata, and previews it."
    CATEGORY = CATEGORY
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "save"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "images": ("IMAGE",),
            "audio": ("AUDIO",),
            "fps": ("INT", {"default": 24, "min": 1, "max": 120}),
            "filename_prefix": ("STRING", {"default": "h3/video"}),
        }, "hidden": {"unique_id": "UNIQUE_ID", "prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}}

    def save(self, images, audio, fps, filename_prefix, unique_id=None, prompt=None, extra_pnginfo=None):
        from .video import next_path, write_mp4

        t0, w0 = time.perf_counter(), time.time()
        out_dir = _host().output_dir()
        path, subfolder = next_path(out_dir, filename_prefix)
        metadata = {}
        if prompt is not None:
            metadata["prompt"] = prompt
        if extra_pnginfo:
            metadata.update(extra_pnginfo)
        write_mp4(path, images, audio, int(fps), metadata)
        rec = _local_record("save", t0, w0, bytes={"mp4": path.stat().st_size}, note=str(path))
        ui = report("H3SaveVideo", unique_id, [rec], "save",
                    ui={"images": [{"filename": path.name, "subfolder": subfolder, "type": "output"}],
                        "animated": [True]})
        return {"ui": ui, "result": ()}


NODE_CLASS_MAPPINGS = {
    "H3LoadEncoders": H3LoadEncoders,
    "H3RemoteDiT": H3RemoteDiT,
    "H3LoRA": H3LoRA,
    "H3Keyframes": H3Keyframes,
    "H3References": H3References,
    "H3TextEncode": H3TextEncode,
    "H3RemoteDenoise": H3RemoteDenoise,
    "H3Decode": H3Decode,
    "H3SaveVideo": H3SaveVideo,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "H3LoadEncoders": "H3 Load Encoders (A)",
    "H3RemoteDiT": "H3 Remote DiT (B)",
    "H3LoRA": "H3 LoRA (B)",
    "H3Keyframes": "H3 Keyframes",
    "H3References": "H3 References",
    "H3TextEncode": "H3 Text Encode (A)",
    "H3RemoteDenoise": "H3 Remote Denoise (B)",
    "H3Decode": "H3 Decode (A)",
    "H3SaveVideo": "H3 Save Video",
}
