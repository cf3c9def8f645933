"""Loader nodes: A's encoders (``H3LoadEncoders``), the DiT on B (``H3RemoteDiT``) and its LoRA adapters
(``H3LoRA``). Each translates its widgets to the engine's resident state (:mod:`..engine.session`) and reports."""

from __future__ import annotations

import os
import time

from ..engine import session
from ..engine.contract import request as rq
from ..engine.contract.configs import A_COMPONENTS, DTYPES, MODEL_COMPONENTS_A, PARALLEL, PARTITIONS, PRECISIONS, TINY
from ..engine.contract.errors import ModelFolderError
from ..engine.contract.timing import StageRecord
from ..engine.model import catalog
from ..engine.model.backends import UI_CHOICES
from ..engine.model.folders import check_model_dir
from ..host import host
from .common import CATEGORY, local_record, reload_note, report
from .values import DiT, dit_parts

#: what the templates name: the released model's usual place
DEFAULT_MODEL_PATH = "/models/MiniMax-H3"
#: the turbo template's LoRA as B names it: under B's model root (`remote_worker setup`'s default: the parent of its
#: --model-path, /models), short enough that the canvas draws the input's label whole beside it
DEFAULT_LORA_PATH = "loras/h3_turbo_4step.safetensors"


#: H3LoadEncoders' optional part pickers: input name -> (ComfyUI folder kind, what the tooltip calls it)
PART_INPUTS = {"text_encoder": ("text_encoders", "Qwen3-VL text encoder (Comfy-Org's qwen3vl_32b_minimax_h3_*)"),
               "vae": ("vae", "video VAE (Comfy-Org's minimax_h3 video VAE, fp16 or int8_convrot)"),
               "audio_vae": ("vae", "audio VAE (Comfy-Org's minimax_h3 audio VAE, fp32)")}


class H3LoadEncoders:
    DESCRIPTION = ("Loads MiniMax-H3's Qwen3-VL text encoder, video VAE and audio VAE on this machine (A), once: from "
                   "the diffusers folder, or each from a single file in ComfyUI's text_encoders / vae folders.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_ENCODERS",)
    RETURN_NAMES = ("encoders",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        session.A_MODEL_ROOTS[:] = a_model_roots()  # what /h3/status lists as A's models
        models = catalog.choices(session.A_MODEL_ROOTS)
        return {"required": {
            "model_path": (models, {"default": catalog.default_choice(models), "tooltip": (
                "diffusers MiniMax-H3 folder on A (found under ComfyUI's models/diffusers; a typed path works too). "
                f"'{TINY}' is a tiny random model built on first use: try the pack without weights.")}),
            "dtype": (list(DTYPES), {"default": "bfloat16"}),
            "attention_backend": (list(UI_CHOICES), {"default": "sdpa"}),
        }, "optional": {
            name: (catalog.part_choices(host().model_folders(kind), name), {"default": catalog.FROM_MODEL, "tooltip": (
                f"the {what} from a single file in ComfyUI's models/{kind}/ (recognised by its keys; quantised "
                f"files are dequantised to dtype), or '{catalog.FROM_MODEL}'. '{TINY}' is the tiny random model's.")})
            for name, (kind, what) in PART_INPUTS.items()
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    # Names model_path so that a typed path (API prompts) passes ComfyUI's list check; this checks it instead.
    @classmethod
    def VALIDATE_INPUTS(cls, model_path=None):
        return check_a_model(model_path)

    def load(self, model_path, dtype, attention_backend, unique_id=None, text_encoder=catalog.FROM_MODEL,
             vae=catalog.FROM_MODEL, audio_vae=catalog.FROM_MODEL):
        t0, w0 = time.perf_counter(), time.time()
        err = check_a_model(model_path)
        if err is not True:
            raise ModelFolderError(err)
        parts = {name: catalog.resolve_part(choice, name, host().model_folders(PART_INPUTS[name][0]))
                 for name, choice in (("text_encoder", text_encoder), ("vae", vae), ("audio_vae", audio_vae))}
        folder = catalog.resolve(model_path, roots=a_model_roots())
        enc, loaded_now = session.encoders(folder, dtype, attention_backend, parts=parts,
                                           tokenizer_dirs=tuple(host().tokenizer_folders()),
                                           held_elsewhere=host().held_elsewhere())
        # the host accounts for A's models from here on (ComfyUI: as its own loaded models, which /free and its
        # eviction unload); what it had unloaded since the last run is loaded again now
        reloaded = host().hold_a_side(enc, MODEL_COMPONENTS_A)
        loads = (sum(r.seconds for r in enc.load_records) if loaded_now else
                 sum(r.seconds for r in reloaded))
        what = catalog.tiny_name(model_path) if catalog.is_tiny(model_path) else str(enc.model_dir)
        files = getattr(enc, "parts", None) or {}
        if files:  # parts from single files: which, and at what
            what += " with " + ", ".join(f"{c} from file {p.path.name} ({p.variant or 'plain'}"
                                         + (f", dequantised to {dtype})" if p.variant else ")") for c, p in files.items())
        plan = getattr(enc, "memory_plan", None)
        state = "loaded" if loaded_now else (reload_note(reloaded) + ":" if reloaded else "resident")
        held = sum(enc.resident_bytes().values()) if hasattr(enc, "resident_bytes") else 0
        rec = local_record("load", t0, w0, load_s=loads,
                           note=f"{state} {what}: {', '.join(enc.resident())}"
                           + (f" · A holds {held / 2**20:.1f} MiB" if held else "")
                           + (f" · {plan.summary()}" if plan is not None else ""))
        return {"ui": report("H3LoadEncoders", unique_id, [rec], "load"), "result": (enc,)}


def a_model_roots() -> list[str]:
    """A's model roots: its diffusers folders, and ComfyUI's transformer folders (``diffusion_models``, ``unet``),
    which an embedded B (``local``, no roots of its own) searches for its picker."""
    h = host()
    return list(dict.fromkeys([*h.model_folders(), *h.model_folders("diffusion_models"), *h.model_folders("unet")]))


def check_a_model(model_path) -> str | bool:
    if model_path is None or catalog.is_tiny(model_path):
        return True
    if not isinstance(model_path, str) or not model_path.strip():
        return f"model_path is empty; choose a model folder, or {TINY!r} to try the pack without weights."
    try:
        check_model_dir(catalog.resolve(model_path, roots=a_model_roots()), A_COMPONENTS)
    except ModelFolderError as exc:
        return f"{exc} To try the pack without weights, choose {TINY!r}."
    return True


class H3RemoteDiT:
    DESCRIPTION = ("Connects to the resident MiniMax-H3 DiT on machine B (a named Ray actor); 'local' starts a "
                   "two-node Ray cluster on this machine. Its output is cached as ComfyUI caches any loader's; each denoise checks "
                   "B's health and finds its worker again (restarted, or its model released: reloaded).")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("H3_DIT",)
    RETURN_NAMES = ("dit",)
    FUNCTION = "connect"

    @classmethod
    def INPUT_TYPES(cls):
        session.A_MODEL_ROOTS[:] = a_model_roots()  # what a 'local' B searches
        models = session.b_model_list()  # fresh: ComfyUI builds (or refreshes) its node list now
        return {"required": {
            "cluster_address": ("STRING", {"default": "local", "tooltip": "'local' or the Ray head host:port"}),
            "actor_name": ("STRING", {"default": "h3_dit*", "tooltip": (
                "the DiT workers to use: one name, a comma-separated list, or a prefix with '*' (h3_dit* = every "
                "worker `remote_worker setup --name h3_dit...` started). Each request goes to the worker that can "
                "start it soonest; a worker lost mid-request hands it to another")}),
            "namespace": ("STRING", {"default": "comfy_h3"}),
            "model_path": (models, {"default": catalog.default_choice(models), "tooltip": (
                "model on machine B, named like ComfyUI's own pickers: relative to the B model root it lies under "
                "(a MiniMax-H3 folder or a transformer file; absolute where two roots hold the same name). The list "
                "is filled each time ComfyUI builds or refreshes its node list (R): asked of B when this ComfyUI is "
                f"connected to it (at most {session.PICKER_BOUND_S:.0f} s, else the last list), and for 'local' (the "
                "default, also before the first run) what its B finds in this machine's model folders. An absolute "
                f"path on B works too. '{TINY}' is a tiny random model B builds on first use.")}),
            "partition": (list(PARTITIONS), {"default": "transformer", "tooltip": (
                "the partition B loads first; B switches to what each workflow needs (ref2va: transformer_ref), or "
                "holds both when its memory plan allows. A transformer file as model_path is this partition (one named "
                "for the other, such as minimax_h3_ref2va_* for transformer, is refused).")}),
            "dtype": (list(DTYPES), {"default": "bfloat16"}),
            "attention_backend": (list(UI_CHOICES), {"default": "sdpa"}),
            "precision": (list(PRECISIONS), {"default": "auto", "tooltip": (
                "how B stores the transformer: auto (dtype; a GGUF or Comfy-Org fp8_scaled/int8 file as stored), bf16 "
                "(such a file dequantised), fp8 (fp8 storage, bf16 "
                "compute: both partitions fit a Spark) or gguf. B checks its memory plan before loading.")}),
        }, "optional": {
            "parallel": (list(PARALLEL), {"default": "off", "tooltip": (
                "machines that denoise one request together (sequence parallel): off = one DiT worker; A+B = a DiT "
                "rank on A (its own process, when A's memory plan has room) with one B; all = A and every B of the "
                "pool; auto = A joins when that finishes the queue sooner. The readout names the ranks.")}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    # ComfyUI's cache key is the inputs (it adds them itself) and this: the identity of the model named, never B's
    # health, so an unchanged prompt runs nothing; each denoise checks B and finds its worker again (session.live)
    @classmethod
    def IS_CHANGED(cls, model_path=None, **kwargs):
        return catalog.identity(model_path, a_model_roots())

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
                precision="auto", parallel="off", unique_id=None):
        from .. import placement  # noqa: PLC0415 - Ray and the B side load when the node runs, not at ComfyUI's load

        t0, w0 = time.perf_counter(), time.time()
        address = rq.check_cluster_address(cluster_address)
        rq.check_actor_name(actor_name)
        session.A_MODEL_ROOTS[:] = a_model_roots()
        ex = session.dit(address, actor_name.strip(), namespace.strip(), model_path.strip(), partition,
                         dtype, attention_backend, precision=precision, actors=placement.ACTORS, parallel=parallel)
        note, extra = connection_readout(ex)
        b = ex.last_health["B"]
        rec = StageRecord("", "connect", "B", b.get("hostname") or b["node_ip"], w0, time.time(),
                          compute_s=time.perf_counter() - t0, note=note)
        ui = report("H3RemoteDiT", unique_id, [rec], "connect", extra={**extra, "status": note})
        return {"ui": ui, "result": (ex,)}


def connection_readout(ex) -> tuple[str, dict]:
    """What ``H3RemoteDiT`` shows: where A and B run, what B serves and holds, the pool, a reconfiguration."""
    health = ex.last_health  # session.dit has just checked it (on start, or on reuse)
    b = health["B"]
    plan = b.get("memory_plan") or {}
    note = f"A {ex.topology.a.ip} · B {b['node_ip']} ({b['device']}; {b_config_text(b)})"
    workers = health.get("workers") or []
    if len(workers) > 1:  # a pool: every worker this node's actor_name matches
        note += f" · pool of {len(workers)}: " + ", ".join(f"{w['name']} {w['node']}" for w in workers)
    if getattr(ex, "b_reload_note", ""):  # B's worker is a new process since this ComfyUI last connected
        note += f" · {ex.b_reload_note}"
    if ex.last_reconfigure:
        note += f" · B reconfigured: {ex.last_reconfigure}"
    residency = b_residency_text(b, session.CLUSTER.started, ex.last_reconfigure)
    if residency:
        note += f" · {residency}"
    if plan.get("summary"):
        note += f" · {plan['summary']}"
    if ex.bclient.parallel != "off":
        group = health.get("group")
        ranks = " + ".join(f"{r['machine']} {r['node']}" for r in group["ranks"]) if group else "formed at the denoise"
        note += f" · parallel {ex.bclient.parallel}: {ranks}"
    extra = {"a_node": ex.topology.a.ip, "b_node": b["node_ip"], "b_device": b["device"],
             # what B holds now; each denoise readout says which partition that request ran on
             "partition": " + ".join(plan.get("resident_partitions") or [b["partition"]]),
             "resident": b.get("resident"), "b_models": session.b_model_choices(),
             "reconfigured": ex.last_reconfigure or None, "precision": b.get("precision"),
             "workers": [{"name": w["name"], "node": w["node"]} for w in workers],
             "memory_plan": plan.get("summary"), "clock_b_minus_a_s": health["clock"]["b_minus_a_s"],
             "parallel": ex.bclient.parallel, "group": health.get("group"),
             "b_resident_bytes": b.get("resident_bytes"), "b_released": b.get("released"),
             "b_already_resident": bool(residency.startswith("B was already resident")), "b_loads": b.get("loads"),
             "b_reloaded": getattr(ex, "b_reload_note", "") or None}
    return note, extra


def b_residency_text(b: dict, joined_at: float, reconfigured: str = "") -> str:
    """Whether B's model was resident before this process joined (a ComfyUI restart in the two-machine layout: B's
    worker is reused, nothing loads; ``reconfigured``: this connection reloaded it), or is released (the next denoise
    reloads it). The load count is the worker's since it started: a reconfigure adds to it, never resets it."""
    rel = b.get("released")
    if rel:
        return (f"B's model is released ({rel.get('cause')}, {rel.get('total_bytes', 0) / 2**20:.1f} MiB): the next "
                "denoise reloads it")
    up = float(b.get("uptime_s") or 0.0)
    if joined_at and up > time.time() - joined_at + 1.0 and reconfigured:
        return (f"B's worker up {up:.0f} s, from before this process joined: {b.get('loads', 0)} load(s) since it "
                f"started, this reconfigure's among them ({b.get('reconfigures', 0)} reconfigure(s))")
    if joined_at and up > time.time() - joined_at + 1.0:
        return (f"B was already resident (its worker up {up:.0f} s, before this process joined; "
                f"{b.get('loads', 0)} load(s), none now)")
    return ""


def b_config_text(b: dict) -> str:
    """What B serves: the model (the file picked, when a partition comes from one), the partition(s) resident, what
    they run as (a quantised file's layers as stored, fp8 storage, the dtype) and the attention backend."""
    held = (b.get("memory_plan") or {}).get("resident_partitions") or [b["partition"]]
    weights = b.get("weights") or {}
    files = list(dict.fromkeys(os.path.basename(w["file"]) for p in held if (w := weights.get(p)) and w.get("file")))
    if catalog.is_tiny(b.get("model", "")):
        model = catalog.tiny_name(b["model"])
    else:  # a transformer file as model_path: B's model_dir is the configs the pack ships, not what was picked
        model = " + ".join(files) if files else b.get("model_dir", "?")
    runs = list(dict.fromkeys(weights[p]["runs"] for p in held if p in weights)) or [b["dtype"]]
    return (f"{model}, {' + '.join(held)}, precision {b.get('precision') or 'auto'}: {' / '.join(runs)}, "
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
            "lora_path": ("STRING", {"default": DEFAULT_LORA_PATH, "tooltip": (
                "the LoRA file on machine B: a name relative to its model roots (as its model picker names models) "
                f"or an absolute path; '{TINY}' is a tiny random 4-step LoRA B builds for the '{TINY}' model")}),
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
        resolved = ex.check_adapter(lora_path)  # on B, before any request: the error lands on this node
        b = (ex.last_health or {}).get("B") or {}
        rec = StageRecord("", "lora", "B", b.get("hostname") or b.get("node_ip", ""), w0, time.time(),
                          compute_s=time.perf_counter() - t0,
                          note=", ".join(f"{os.path.basename(p)} x{w:g}" for p, w in adapters))
        extra = {"adapters": [list(a) for a in adapters], "resolved": resolved}
        ui = report("H3LoRA", unique_id, [rec], "lora", extra=extra)
        return {"ui": ui, "result": (DiT(ex, adapters),)}
