"""ComfyUI nodes (classic V1 API: plain classes, no ComfyUI import). Thin: they translate ComfyUI values to the
engine and back, and report each node's timing record; everything else is the engine's.

Graph: H3LoadEncoders -> H3TextEncode (+ H3Keyframes | H3References) -> H3RemoteDenoise (+ H3RemoteDiT) -> H3Decode
-> H3SaveVideo (or ComfyUI's own CreateVideo/SaveVideo: H3Decode returns standard IMAGE and AUDIO).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
from concurrent.futures import Future

from ..engine.model import catalog
from ..engine.contract import request as rq
from ..engine.model.backends import UI_CHOICES
from ..engine.model.memory_plan import PRECISIONS
from ..engine.model.split import A_COMPONENTS, DTYPES, PARTITIONS, ModelFolderError, check_model_dir
from ..engine.contract.timing import StageRecord

log = logging.getLogger("comfy_h3.nodes")

CATEGORY = "MiniMax-H3"
DEFAULT_MODEL_PATH = "/models/MiniMax-H3"  # what the templates name: the released model's usual place
MAX_SEED = rq.MAX_SEED
MAX_BATCH = 64  # requests of one graph run
TINY = catalog.TINY


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
    """H3_CONDITIONING: one encoded request, held on A (this process) as numpy, so it is never lost with the
    cluster. In a batch it is a handle to an encode still in flight: ``encoded`` resolves to the payload."""

    request_id: str
    encoded: Future  # of wire.EncodedRequest
    uses: int = 0  # denoise runs so far: the first keeps the encode's request id, so a timeline joins them

    @property
    def payload(self):
        return self.encoded.result()

    def next_request_id(self) -> str:
        self.uses += 1
        return self.request_id if self.uses == 1 else f"{self.request_id}.{self.uses}"


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


@dataclasses.dataclass
class PendingLatents:
    """H3_LATENTS of a batch: a handle to one request still in flight (encode on A, denoise on B, B->A). H3Decode
    waits for it; every handle of the batch can cancel them all."""

    index: int
    request_id: str
    future: Future  # of engine.batch.Denoised
    batch: "BatchRun"


@dataclasses.dataclass(eq=False)  # identity: the handles of one batch share it
class BatchRun:
    """What the handles of one batch share: the executor, every request id, the encodes, one progress counter."""

    executor: object
    request_ids: list
    encodes: list
    progress: object  # engine.batch.BatchProgress
    denoise_node: object = None

    def cancel(self) -> None:
        from ..engine.executor import batch

        batch.cancel(self.executor, self.request_ids, self.encodes)


def _items(value) -> list:
    """A node input as a list: ComfyUI hands ``INPUT_IS_LIST`` nodes lists; a direct call may pass one value."""
    return value if isinstance(value, list) else [value]


def _one(value):
    """The single value of an input that a batch shares (encoders, dit, decode_on, unique_id)."""
    values = _items(value)
    return values[0] if values else None


def _batch_size(**inputs) -> int:
    """N of a batch: every list input has 1 or N items; anything else is an error naming the input."""
    sizes = {k: len(_items(v)) for k, v in inputs.items() if v is not None}
    n = max(sizes.values(), default=1)
    bad = {k: m for k, m in sizes.items() if m not in (1, n)}
    if bad or n == 0:
        raise rq.RequestError(
            "the inputs of one batch must each hold 1 or the same number N of items; got "
            + ", ".join(f"{k}: {m}" for k, m in sizes.items()) + ". Give every list the same length."
        )
    if n > MAX_BATCH:
        raise rq.RequestError(f"a batch of {n} requests is over the {MAX_BATCH} limit; split it into several runs.")
    return n


def _at(value, i: int):
    values = _items(value)
    return values[min(i, len(values) - 1)] if values else None


def _done(value) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


# ------------------------------------------------------------------------------------------------ helpers
def _host():
    from ..host.adapter import host

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
    from ..engine import session

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
    return StageRecord(request_id, stage, "A", _a_node(), w0, time.time(), compute_s=time.perf_counter() - t0, **kw)


def _a_node() -> str:
    """How A's records name this machine: its host name, the same before and after Ray starts (its cluster address
    is shown by H3RemoteDiT and /h3/status)."""
    return socket.gethostname()


def _named_by_host(records: list[StageRecord], b_host: str) -> list[StageRecord]:
    """The executor's records name nodes by cluster address; the UI names both machines by host name."""
    return [dataclasses.replace(r, node=_a_node() if r.machine == "A" else (b_host or r.node)) for r in records]


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


def _short(prompt, limit: int = 40) -> str:
    text = str(prompt or "").strip().replace("\n", " ")
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


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
        from ..engine import session

        session.A_MODEL_ROOTS[:] = _host().model_folders()  # what /h3/status lists as A's models
        models = catalog.choices(session.A_MODEL_ROOTS)
        return {"required": {
            "model_path": (models, {"default": models[0], "tooltip": (
                "diffusers MiniMax-H3 folder on A (found under ComfyUI's models/diffusers; a typed path works too). "
                f"'{TINY}' is a tiny random model built on first use: try the pack without weights.")}),
            "dtype": (list(DTYPES), {"default": "bfloat16"}),
            "attention_backend": (list(UI_CHOICES), {"default": "sdpa"}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    # Names model_path so that a typed path (API prompts) passes ComfyUI's list check; this checks it instead.
    @classmethod
    def VALIDATE_INPUTS(cls, model_path=None):
        return _check_a_model(model_path)

    def load(self, model_path, dtype, attention_backend, unique_id=None):
        from ..engine import session

        t0, w0 = time.perf_counter(), time.time()
        err = _check_a_model(model_path)
        if err is not True:
            raise ModelFolderError(err)
        enc, loaded_now = session.encoders(catalog.resolve(model_path), dtype, attention_backend)
        loads = sum(r.seconds for r in enc.load_records) if loaded_now else 0.0
        what = TINY if catalog.is_tiny(model_path) else str(enc.model_dir)
        plan = getattr(enc, "memory_plan", None)
        rec = _local_record("load", t0, w0, load_s=loads,
                            note=("loaded" if loaded_now else "resident") + f" {what}: {', '.join(enc.resident())}"
                            + (f" · {plan.summary()}" if plan is not None else ""))
        return {"ui": report("H3LoadEncoders", unique_id, [rec], "load"), "result": (enc,)}


def _check_a_model(model_path) -> str | bool:
    if model_path is None or catalog.is_tiny(model_path):
        return True
    if not isinstance(model_path, str) or not model_path.strip():
        return f"model_path is empty; choose a model folder, or {TINY!r} to try the pack without weights."
    try:
        check_model_dir(model_path.strip(), A_COMPONENTS)
    except ModelFolderError as exc:
        return f"{exc} To try the pack without weights, choose {TINY!r}."
    return True


class H3RemoteDiT:
    DESCRIPTION = ("Connects to the resident MiniMax-H3 DiT on machine B (a named Ray actor); 'local' starts a "
                   "two-node Ray cluster on this machine. Checks topology and health on every run.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_DIT",)
    RETURN_NAMES = ("dit",)
    FUNCTION = "connect"

    @classmethod
    def INPUT_TYPES(cls):
        from ..engine import session

        models = session.b_model_choices()
        return {"required": {
            "cluster_address": ("STRING", {"default": "local", "tooltip": "'local' or the Ray head host:port"}),
            "actor_name": ("STRING", {"default": "h3_dit*", "tooltip": (
                "the DiT workers to use: one name, a comma-separated list, or a prefix with '*' (h3_dit* = every "
                "worker `remote_worker setup --name h3_dit...` started). Each request goes to the worker that can "
                "start it soonest; a worker lost mid-request hands it to another")}),
            "namespace": ("STRING", {"default": "comfy_h3"}),
            "model_path": (models, {"default": models[0], "tooltip": (
                "model on machine B: the list is what B reported at the last connection (run once, then Refresh); "
                f"a typed path on B works too. '{TINY}' is a tiny random model B builds on first use.")}),
            "partition": (list(PARTITIONS), {"default": "transformer", "tooltip": (
                "the partition B loads first; B switches to what each workflow needs (ref2va: transformer_ref), or "
                "holds both when its memory plan allows. A transformer file as model_path is this partition.")}),
            "dtype": (list(DTYPES), {"default": "bfloat16"}),
            "attention_backend": (list(UI_CHOICES), {"default": "sdpa"}),
            "precision": (list(PRECISIONS), {"default": "auto", "tooltip": (
                "how B stores the transformer: auto (dtype; a GGUF file as stored), bf16, fp8 (fp8 storage, bf16 "
                "compute: both partitions fit a Spark) or gguf. B checks its memory plan before loading.")}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")  # re-check topology and health on every run

    # No **kwargs in any VALIDATE_INPUTS: ComfyUI skips its own min/max and combo checks for every input a
    # VALIDATE_INPUTS names, and for all of them when it takes **kwargs. A linked input arrives as None. ComfyUI
    # shows a VALIDATE_INPUTS message once per input the method names, so each names only the inputs its message is
    # about: here model_path (a typed path on B must pass the list check); the address is checked when it runs.
    @classmethod
    def VALIDATE_INPUTS(cls, model_path=None):
        if model_path is not None and (not isinstance(model_path, str) or not model_path.strip()):
            return f"model_path is empty; choose a model B has, or {TINY!r} to try the pack without weights."
        return True

    def connect(self, cluster_address, actor_name, namespace, model_path, partition, dtype, attention_backend,
                precision="auto", unique_id=None):
        from .. import placement
        from ..engine import session

        t0, w0 = time.perf_counter(), time.time()
        address = rq.check_cluster_address(cluster_address)
        from ..engine.executor import pool

        try:
            pool.parse_spec(actor_name)
        except ValueError as exc:
            raise rq.RequestError(f"{exc} Use the name `remote_worker setup` printed.") from None
        session.A_MODEL_ROOTS[:] = _host().model_folders()
        ex = session.dit(address, actor_name.strip(), namespace.strip(), model_path.strip(), partition,
                         dtype, attention_backend, precision=precision, actors=placement.ACTORS)
        health = ex.last_health  # session.dit has just checked it (on start, or on reuse)
        b = health["B"]
        note = f"A {ex.topology.a.ip} · B {b['node_ip']} ({b['device']}; {_b_config_text(b)})"
        workers = health.get("workers") or []
        if len(workers) > 1:  # a pool: every worker this node's actor_name matches
            note += f" · pool of {len(workers)}: " + ", ".join(f"{w['name']} {w['node']}" for w in workers)
        if ex.last_reconfigure:
            note += f" · B reconfigured: {ex.last_reconfigure}"
        if (b.get("memory_plan") or {}).get("summary"):
            note += f" · {b['memory_plan']['summary']}"
        rec = StageRecord("", "connect", "B", b.get("hostname") or b["node_ip"], w0, time.time(),
                          compute_s=time.perf_counter() - t0, note=note)
        ui = report("H3RemoteDiT", unique_id, [rec], "connect",
                    extra={"a_node": ex.topology.a.ip, "b_node": b["node_ip"], "b_device": b["device"],
                           # what B holds now; each denoise readout says which partition that request ran on
                           "partition": " + ".join((b.get("memory_plan") or {}).get("resident_partitions")
                                                   or [b["partition"]]),
                           "resident": b.get("resident"),
                           "b_models": session.b_model_choices(),
                           "reconfigured": ex.last_reconfigure or None, "precision": b.get("precision"),
                           "workers": [{"name": w["name"], "node": w["node"]} for w in workers],
                           "memory_plan": (b.get("memory_plan") or {}).get("summary"),
                           "clock_b_minus_a_s": health["clock"]["b_minus_a_s"]})
        _host().progress_text(note, unique_id)
        return {"ui": ui, "result": (ex,)}


def _b_config_text(b: dict) -> str:
    """What B serves: model, partition(s) resident, dtype and attention backend."""
    model = TINY if catalog.is_tiny(b.get("model", "")) else b.get("model_dir", "?")
    held = (b.get("memory_plan") or {}).get("resident_partitions") or [b["partition"]]
    return (f"{model}, {' + '.join(held)}, {b['dtype']}, precision {b.get('precision') or 'auto'}, "
            f"attention {b.get('attention_choice') or b['attention_backend']}")


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
            "lora_path": ("STRING", {"default": "/models/loras/h3_turbo_4step.safetensors", "tooltip": (
                f"path on machine B; '{TINY}' is a tiny random 4-step LoRA B builds for the '{TINY}' model")}),
            "strength": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.05}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def VALIDATE_INPUTS(cls, lora_path=None):  # strength: ComfyUI's own range check
        if lora_path is not None:
            try:
                rq.check_adapters([(lora_path, 1.0)])
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


class H3PromptList:
    DESCRIPTION = ("Several prompts for one graph run, one per line (blank lines skipped), each with a seed: fixed "
                   "(the same for all), increment (seed, seed+1, ...) or random (drawn from the seed). Connect prompt "
                   "to H3TextEncode's prompt and seed to H3RemoteDenoise's seed: the H3 nodes pipeline the requests "
                   "across A and B.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("STRING", "INT")
    RETURN_NAMES = ("prompt", "seed")
    OUTPUT_IS_LIST = (True, True)
    FUNCTION = "make"
    SEED_MODES = ("fixed", "increment", "random")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "prompts": ("STRING", {"multiline": True, "default": "", "tooltip": "one prompt per line"}),
            "seed": ("INT", {"default": 0, "min": 0, "max": MAX_SEED, "control_after_generate": True}),
            "seed_mode": (list(cls.SEED_MODES), {"default": "increment"}),
        }}

    @classmethod
    def VALIDATE_INPUTS(cls, prompts=None):
        if prompts is not None:
            try:
                cls.parse(prompts)
            except rq.RequestError as exc:
                return str(exc)
        return True

    @staticmethod
    def parse(text) -> list[str]:
        if not isinstance(text, str):
            raise rq.RequestError(f"prompts is a {type(text).__name__}; give text, one prompt per line.")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if not lines:
            raise rq.RequestError("prompts is empty; write one prompt per line.")
        if len(lines) > MAX_BATCH:
            raise rq.RequestError(f"prompts has {len(lines)} lines, over the {MAX_BATCH} of one run; split them.")
        for i, line in enumerate(lines):
            try:
                rq.check_prompt(line)
            except rq.RequestError as exc:
                raise rq.RequestError(f"prompt line {i + 1}: {exc}") from None
        return lines

    def make(self, prompts, seed, seed_mode):
        import numpy as np

        lines = self.parse(prompts)
        seed = rq.check_seed(seed)
        if seed_mode == "fixed":
            seeds = [seed] * len(lines)
        elif seed_mode == "increment":
            seeds = [(seed + i) % (MAX_SEED + 1) for i in range(len(lines))]
        elif seed_mode == "random":
            rng = np.random.default_rng(seed)
            seeds = [int(x) for x in rng.integers(0, 2**63 - 1, size=len(lines), dtype=np.int64)]
        else:
            raise rq.RequestError(f"seed_mode is {seed_mode!r}; choose one of {list(self.SEED_MODES)}.")
        return (lines, seeds)


class H3TextEncode:
    DESCRIPTION = ("Encodes the prompt (and keyframes or references) on A. The workflow follows from what is "
                   "connected: nothing = t2va, keyframes = fl2va, references = ref2va. width/height 0 = automatic. "
                   "A list of prompts (H3PromptList or any list output) is a batch: each is checked before any is "
                   "encoded, and they are encoded one after another while B already works on the first.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_CONDITIONING",)
    RETURN_NAMES = ("conditioning",)
    FUNCTION = "encode"
    INPUT_IS_LIST = True
    OUTPUT_IS_LIST = (True,)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "encoders": ("H3_ENCODERS",),
            "prompt": ("STRING", {"multiline": True, "default": ""}),
            "width": ("INT", {"default": 832, "min": 0, "max": 4096, "step": 32}),
            "height": ("INT", {"default": 480, "min": 0, "max": 4096, "step": 32}),
            "num_frames": ("INT", {"default": 124, "min": rq.valid_frame_range()[0], "max": rq.valid_frame_range()[1],
                                   "tooltip": "at 24 fps; snapped up to 17n+5; 124..345 (5-15 s)"}),
        }, "optional": {"keyframes": ("H3_KEYFRAMES",), "references": ("H3_REFERENCES",)},
            "hidden": {"unique_id": "UNIQUE_ID"}}

    # The canvas check needs both sides, so it names both; num_frames is ComfyUI's range check, and the prompt is
    # checked when the node runs (before anything is encoded), so no message lands on an input it is not about.
    @classmethod
    def VALIDATE_INPUTS(cls, width=None, height=None):
        width, height = _one(width), _one(height)  # lists (INPUT_IS_LIST); a linked input arrives as None
        if isinstance(width, int) and isinstance(height, int):
            if (width == 0) != (height == 0):
                return f"width {width} and height {height}: set both to 0 (automatic) or both to a size."
            err = _canvas_errors(width, height)
            if err:
                return err
        return True

    def encode(self, encoders, prompt, width, height, num_frames, keyframes=None, references=None, unique_id=None):
        encoders, unique_id = _one(encoders), _one(unique_id)
        n = _batch_size(prompt=prompt, width=width, height=height, num_frames=num_frames, keyframes=keyframes,
                        references=references)
        reqs = []
        for i in range(n):  # every request is checked before any is encoded
            try:
                reqs.append(rq.validate_request(self._request(_at(prompt, i), _at(width, i), _at(height, i),
                                                              _at(num_frames, i), _at(keyframes, i),
                                                              _at(references, i))))
            except rq.RequestError as exc:
                raise (rq.RequestError(f"request {i + 1} of {n} ({_short(_at(prompt, i))}): {exc}") if n > 1
                       else exc) from None

        def reported(i, payload, seconds, started):
            rec = StageRecord(payload.request_id, "encode", "A", _a_node(), started, time.time(), compute_s=seconds,
                              bytes=payload.field_bytes())
            extra = {"workflow": payload.workflow, "canvas": f"{payload.width}x{payload.height}",
                     "num_frames": payload.num_frames, **({"batch": [i + 1, n]} if n > 1 else {})}
            return report("H3TextEncode", unique_id, [rec], "encode", extra=extra)

        if n == 1:
            t0, w0 = time.perf_counter(), time.time()
            payload = encoders.encode(reqs[0])
            ui = reported(0, payload, time.perf_counter() - t0, w0)
            return {"ui": ui, "result": ([Conditioning(payload.request_id, _done(payload))],)}
        from ..engine.executor import batch

        futures = batch.encode_all(encoders, reqs, on_done=reported)  # in order, while B starts on the first
        _host().progress_text(f"{n} prompts: encoding one after another on A", unique_id)
        return {"ui": {}, "result": ([Conditioning(r.request_id, f) for r, f in zip(reqs, futures)],)}

    @staticmethod
    def _request(prompt, width, height, num_frames, keyframes, references) -> rq.H3Request:
        rq.check_prompt(prompt)
        req = rq.H3Request(prompt=prompt, height=height or None, width=width or None, num_frames=num_frames,
                           steps=1, seed=0)
        if keyframes is not None:
            req.first_image, req.last_image = keyframes.first, keyframes.last
        if references is not None:
            req.reference_images, req.reference_audio = list(references.images), references.audio
        return req


class H3RemoteDenoise:
    DESCRIPTION = ("Denoises on machine B: sends the conditioning A->B, follows B's steps on the progress bar, "
                   "brings the latents B->A. ComfyUI's interrupt stops B within one step. A batch (a list of "
                   "conditionings) is handed on at once as requests in flight: at most max_in_flight of them between "
                   "A and B at a time; H3Decode decodes each as it comes back while B works on the next.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_LATENTS",)
    RETURN_NAMES = ("latents",)
    FUNCTION = "denoise"
    INPUT_IS_LIST = True
    OUTPUT_IS_LIST = (True,)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "dit": ("H3_DIT",),
            "conditioning": ("H3_CONDITIONING",),
            "seed": ("INT", {"default": 0, "min": 0, "max": MAX_SEED, "control_after_generate": True}),
            "steps": ("INT", {"default": 50, "min": 1, "max": rq.MAX_STEPS,
                              "tooltip": "sigma points; 50 for the base model (49 forwards)"}),
        }, "optional": {
            "max_in_flight": ("INT", {"default": 2, "min": 1, "max": 8, "tooltip": (
                "batches: requests between A and B at once. 2 keeps B busy (it receives the next while it denoises "
                "one) and A encoding/decoding beside it; more only holds more payloads in memory")}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def VALIDATE_INPUTS(cls, steps=None):  # seed: ComfyUI's own range check (0..2**64-1)
        try:
            for value in _items(steps):  # a list (INPUT_IS_LIST); a linked input arrives as None
                if value is not None:
                    rq.check_steps(value)
        except rq.RequestError as exc:
            return str(exc)
        return True

    async def denoise(self, dit, conditioning, seed, steps, max_in_flight=2, unique_id=None):
        dit, unique_id, max_in_flight = _one(dit), _one(unique_id), int(_one(max_in_flight) or 2)
        conds = _items(conditioning)
        n = _batch_size(conditioning=conds, seed=seed, steps=steps)
        for i in range(n):  # every request's values are checked before any is sent
            rq.check_steps(_at(steps, i))
            rq.check_seed(_at(seed, i))
        if n == 1 and conds[0].encoded.done():
            return await self._denoise_one(dit, conds[0], _at(seed, 0), _at(steps, 0), unique_id)
        return self._start_batch(dit, conds, [_at(seed, i) for i in range(n)], [_at(steps, i) for i in range(n)],
                                 max_in_flight, unique_id)

    def _start_batch(self, dit, conds, seeds, steps, max_in_flight, unique_id):
        """Hand the batch to the executor and return at once: one handle per request, in prompt order."""
        from ..engine.executor import batch

        h = _host()
        ex, adapters = dit_parts(dit)
        n = len(conds)
        rids = [c.next_request_id() for c in conds]
        jobs = [(rid, c.encoded, _payload_maker(rid, sd, st, adapters))
                for rid, c, sd, st in zip(rids, conds, seeds, steps)]
        run = BatchRun(ex, [rid for rid, _, _ in jobs], [c.encoded for c in conds],
                       batch.BatchProgress(n, max(steps) - 1), unique_id)
        index = {rid: i for i, rid in enumerate(run.request_ids)}
        prompt_id = h.prompt_id()

        def on_step(ev):  # the executor's thread
            run.progress.step(ev.request_id, ev.index)
            try:
                h.send_event("h3.progress", {"prompt_id": prompt_id, "node": str(unique_id),
                                             "request_id": ev.request_id, "step": ev.index + 1, "total": ev.total,
                                             "seconds": ev.seconds, "batch": [index[ev.request_id] + 1, n]})
            except Exception as exc:  # noqa: BLE001 - a UI that went away must not stop the batch
                log.warning("could not send h3.progress: %s", exc)
            if h.interrupted():  # the graph may be between nodes: stop every request of the batch here too
                run.cancel()

        def on_done(d):  # the executor's thread: the request's latents are on A
            records = _named_by_host(d.records, (ex.last_health or {}).get("B", {}).get("hostname", ""))
            report("H3RemoteDenoise", unique_id, records, "denoise", extra=_schedule_extra(d.records, steps[d.index])
                   | {"batch": [d.index + 1, n]})

        futures = batch.denoise_all(ex, jobs, max_in_flight, on_step, on_done)
        h.progress_text(f"{n} requests in flight to B, at most {max_in_flight} at a time", unique_id)
        return {"ui": {}, "result": ([PendingLatents(i, rid, f, run) for i, (rid, f) in
                                      enumerate(zip(run.request_ids, futures))],)}

    async def _denoise_one(self, dit, conditioning, seed, steps, unique_id):
        from ..engine.executor.executor import H3Cancelled

        h = _host()
        dit, adapters = dit_parts(dit)
        rid = conditioning.next_request_id()
        payload = _payload_maker(rid, seed, steps, adapters)(conditioning.payload)
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
        records = _named_by_host([*den.records, b_to_a], (dit.last_health or {}).get("B", {}).get("hostname", ""))
        extra = _schedule_extra(records, steps) | {"total_s": time.perf_counter() - t0}
        ui = report("H3RemoteDenoise", unique_id, records, "denoise", extra=extra)
        h.progress_text(extra["schedule"], unique_id)
        return {"ui": ui, "result": ([Latents(latents, records)],)}


def _payload_maker(rid: str, seed: int, steps: int, adapters: tuple):
    """The A->B payload of one denoise run, made from the encoded request: its request id, seed, steps, adapters."""
    from ..engine.contract import wire

    def make(payload):
        return dataclasses.replace(payload, request_id=rid, seed=int(seed), num_inference_steps=int(steps),
                                   adapters=tuple(wire.AdapterSpec(p, w) for p, w in adapters))

    return make


def _schedule_extra(records: list[StageRecord], steps: int) -> dict:
    """What a denoise readout shows: forwards, the schedule B ran and where (partition, dtype, attention)."""
    den = next(r for r in records if r.stage == "denoise")
    ran = den.info
    where = f" on {ran['partition']} ({ran['dtype']}, {ran['attention_backend']})" if ran else ""
    return {"steps_total": len(den.steps), "schedule": f"{steps} sigma points{where}: {den.note}", "ran": ran}


def _interrupt_exception():
    from ..host.adapter import host

    h = host()
    if getattr(h, "name", "") == "comfyui":
        import comfy.model_management

        return comfy.model_management.InterruptProcessingException()
    from ..engine.executor.executor import H3Cancelled

    return H3Cancelled("interrupted: the request was cancelled on B")


class H3Decode:
    DESCRIPTION = ("Decodes B's latents into frames (IMAGE) and stereo sound (AUDIO), plus the frame rate: on A, or "
                   "split with B (B decodes the last clips from the latents it still holds, A the rest and blends; "
                   "the frames are identical).")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE", "AUDIO", "INT")
    RETURN_NAMES = ("images", "audio", "fps")
    FUNCTION = "decode"
    DECODE_ON = ("auto", "A", "A+B")
    INPUT_IS_LIST = True
    OUTPUT_IS_LIST = (True, True, True)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"encoders": ("H3_ENCODERS",), "latents": ("H3_LATENTS",)},
                "optional": {"decode_on": (list(cls.DECODE_ON), {
                    "default": "auto",
                    "tooltip": "auto: split the video decode with B when B holds the video VAE, has no denoise "
                               "waiting and the decode is long enough; A: A alone; A+B: split whenever B can"})},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    def decode(self, encoders, latents, decode_on="auto", unique_id=None):
        encoders, decode_on, unique_id = _one(encoders), _one(decode_on) or "auto", _one(unique_id)
        items = _items(latents)
        if not any(isinstance(x, PendingLatents) for x in items):
            outs = [self._decode_one(encoders, x, decode_on, unique_id) for x in items]
            return {"ui": {"h3_timing": [t for o in outs for t in o["ui"]["h3_timing"]]},
                    "result": tuple([o["result"][k] for o in outs] for k in range(3))}
        return self._decode_batch(encoders, items, decode_on, unique_id)

    def _decode_batch(self, encoders, items: list, decode_on: str, unique_id):
        """Decode a batch in prompt order as each request's latents arrive (B works on the next meanwhile). The
        progress bar counts the whole batch; an interrupt stops every request; a failed request is named, and the
        videos already decoded are saved before the error is raised."""
        from concurrent.futures import CancelledError

        from ..engine.executor.executor import H3Cancelled, H3Error

        h = _host()
        runs = list(dict.fromkeys(x.batch for x in items if isinstance(x, PendingLatents)).keys())
        total = sum(r.progress.total for r in runs)
        bar = h.progress(unique_id, total, "H3 batch")
        done, failed, uis = [], [], []

        def stop_all():
            for r in runs:
                r.cancel()

        try:
            for item in items:
                if isinstance(item, PendingLatents):
                    while True:
                        try:
                            den = item.future.result(timeout=0.1)
                            break
                        except TimeoutError:
                            pass
                        except (H3Cancelled, CancelledError):
                            if h.interrupted():
                                raise _interrupt_exception() from None
                            den = None
                            failed.append((item, "cancelled"))
                            break
                        except Exception as exc:  # noqa: BLE001 - named with its request below
                            den = None
                            failed.append((item, str(exc)))
                            break
                        finally:
                            bar.update(sum(r.progress.value for r in runs), total)
                        if h.interrupted():
                            stop_all()
                            raise _interrupt_exception()
                    if den is None:
                        continue
                    value = Latents(den.latents, den.records)
                else:
                    value = item
                out = self._decode_one(encoders, value, decode_on, unique_id)
                uis.extend(out["ui"]["h3_timing"])
                done.append((item, out["result"]))
                if isinstance(item, PendingLatents):
                    item.batch.progress.decoded()
                bar.update(sum(r.progress.value for r in runs), total)
        except BaseException:
            stop_all()
            raise
        finally:
            bar.close()
        if failed:
            saved = _save_partial(done, h)
            names = "; ".join(f"request {x.index + 1} of {len(items)} ({x.request_id}): {why}" for x, why in failed)
            raise H3Error(f"{len(failed)} of {len(items)} requests failed: {names}. The {len(done)} finished videos "
                          f"were saved: {', '.join(map(str, saved)) or 'none'}.")
        return {"ui": {"h3_timing": uis}, "result": tuple([r[k] for _, r in done] for k in range(3))}

    def _decode_one(self, encoders, latents, decode_on="auto", unique_id=None):
        import sys

        import torch

        h = _host()
        t0, w0 = time.perf_counter(), time.time()
        rid = latents.payload.request_id
        executor_mod = sys.modules.get("comfy_h3_nodes.engine.executor.executor")  # no executor imported: none holds B's copy
        ex = executor_mod.holder_of(rid) if executor_mod is not None and decode_on != "A" else None
        if executor_mod is not None and ex is None:
            executor_mod.release_held(rid)  # decoded on A alone: B's copy of the latents is not needed
        if ex is not None:
            try:
                media, records, plan = ex.decode_received(encoders, latents.payload, decode_on, h.interrupted)
            except executor_mod.H3Cancelled:
                raise _interrupt_exception() from None
            records = _named_by_host(records, (ex.last_health or {}).get("B", {}).get("hostname", ""))
            how = plan.why
        else:
            media = encoders.decode(latents.payload)
            how = "decode_on 'A'" if decode_on == "A" else "A alone: no DiT of this process holds these latents on B"
            records = [StageRecord(rid, "decode", "A", _a_node(), w0, time.time(), compute_s=time.perf_counter() - t0,
                                   bytes={"frames": int(media.frames.nbytes), "audio": int(media.audio.nbytes)},
                                   note="" if decode_on == "A" else how)]
        images = torch.from_numpy(media.frames)
        audio = {"waveform": torch.from_numpy(media.audio).unsqueeze(0), "sample_rate": media.sample_rate}
        ui = report("H3Decode", unique_id, sorted(records, key=lambda r: r.machine != "B"), "decode",
                    extra={"frames": int(media.frames.shape[0]), "sample_rate": media.sample_rate,
                           "compute_s": time.perf_counter() - t0, "decode_on": how})
        return {"ui": ui, "result": (images, audio, media.fps)}


def _save_partial(done: list, h) -> list:
    """The finished videos of a batch that failed part-way, written before the error is raised (nothing is lost)."""
    from ..engine.media import next_path, write_mp4

    paths = []
    for _, (images, audio, fps) in done:
        path, _ = next_path(h.output_dir(), "h3/batch_partial")
        write_mp4(path, images, audio, int(fps), {})
        paths.append(path)
    return paths


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
        from ..engine.media import next_path, write_mp4

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
    "H3PromptList": H3PromptList,
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
    "H3PromptList": "H3 Prompt List (batch)",
    "H3TextEncode": "H3 Text Encode (A)",
    "H3RemoteDenoise": "H3 Remote Denoise (B)",
    "H3Decode": "H3 Decode (A)",
    "H3SaveVideo": "H3 Save Video",
}
