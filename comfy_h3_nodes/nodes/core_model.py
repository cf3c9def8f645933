"""``H3RemoteModel``: ComfyUI's own ``MODEL`` for MiniMax-H3 with the DiT on machine B, for ComfyUI's own H3 graphs.

Swap it for core's ``UNETLoader`` and keep every other node (``MiniMaxH3ImageToVideo``, ``BasicGuider`` /
``CFGGuider``, ``KSampler`` or ``SamplerCustomAdvanced`` with any sampler and scheduler, ``VAEDecode``, ...): the model
is ComfyUI's own (detected from the file B serves), and each forward the sampler makes runs on B's resident DiT
(:mod:`..host.remote_model`). Registered only inside ComfyUI (the pack's root ``__init__``): outside it there is no
sampler to drive it.
"""

from __future__ import annotations

import functools
import logging
import pathlib
import time

from ..engine import session
from ..engine.contract import request as rq
from ..engine.contract.configs import DTYPES, PRECISIONS, SAMPLER_PARALLEL
from ..engine.contract.timing import StageRecord
from ..engine.model import catalog
from ..engine.model.formats import WORKFLOW_PARTITION, named_workflow
from ..host import host
from .common import CATEGORY, report
from .loaders import a_model_roots, connection_readout


class H3RemoteModel:
    DESCRIPTION = ("ComfyUI's MODEL for MiniMax-H3 whose DiT runs on machine B: use it in place of UNETLoader in "
                   "ComfyUI's own H3 workflows. The sampler stays on this machine; each of its forwards runs on B's "
                   "resident DiT, and the sampler node's readout shows the forwards and their transfers.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        session.A_MODEL_ROOTS[:] = a_model_roots()
        models = unet_names(session.b_model_list())
        return {"required": {
            "unet_name": (models, {"tooltip": (
                "the Comfy-Org MiniMax-H3 transformer file on machine B (the name UNETLoader shows for the same file "
                "in ComfyUI's diffusion_models folder)")}),
            "dtype": (list(DTYPES), {"default": "bfloat16", "tooltip": "B's compute dtype (and the sampler's on A)"}),
            "precision": (list(PRECISIONS), {"default": "auto"}),
            "cluster_address": ("STRING", {"default": "local", "tooltip": "'local' or the Ray head host:port"}),
        }, "optional": {
            "parallel": (list(SAMPLER_PARALLEL), {"default": "off", "tooltip": (
                "machines that run each forward together (sequence parallel): off = B's DiT worker; A+B = a DiT rank "
                "on this machine (its own process, when A's memory plan has room) with B's worker; all = A and every "
                "B of the pool. The sampler node's readout names the ranks.")}),
            "actor_name": ("STRING", {"default": "h3_dit*"}),
            "namespace": ("STRING", {"default": "comfy_h3"}),
        }, "hidden": {"unique_id": "UNIQUE_ID"}}

    # ComfyUI's cache key: the inputs and the identity of the file named (never B's health: each sampling checks
    # B and finds its worker again, session.live), so an unchanged prompt, or a change after the sampler, runs no B
    @classmethod
    def VALIDATE_INPUTS(cls, unet_name):
        """Any name ComfyUI's list check would refuse before B was asked (the list is A's view until this process
        reaches B): B resolves it whatever layout its roots have, and refuses a name it has not in one sentence
        naming this input and the names it has."""
        if not isinstance(unet_name, str) or not unet_name.strip():
            return f"unet_name is empty; choose a transformer file B has, or {catalog.TINY!r}."
        return True

    @classmethod
    def IS_CHANGED(cls, unet_name=None, **kwargs):
        return catalog.identity(unet_name, a_model_roots())

    def load(self, unet_name, dtype, precision, cluster_address, parallel="off", actor_name="h3_dit*",
             namespace="comfy_h3", unique_id=None):
        from .. import placement  # noqa: PLC0415 - Ray and B's side load when the node runs
        from ..host import remote_model  # noqa: PLC0415 - imports ComfyUI's model code: only inside ComfyUI
        import torch  # noqa: PLC0415

        t0, w0 = time.perf_counter(), time.time()
        address = rq.check_cluster_address(cluster_address)
        rq.check_actor_name(actor_name)
        session.A_MODEL_ROOTS[:] = a_model_roots()
        # a ref2va file (its name or metadata says so) is B's transformer_ref partition, any other its transformer
        partition = WORKFLOW_PARTITION.get(named_workflow(pathlib.Path(unet_name.strip())), "transformer")
        ex = session.dit(address, actor_name.strip(), namespace.strip(), unet_name.strip(), partition, dtype,
                         "sdpa", precision=precision, actors=placement.ACTORS, parallel=parallel, asked_by=ASKED_BY)
        info = ex.transformer_file(partition)
        patcher = remote_model.build_model(info, live_sampling(ex), host().interrupted, dtype=getattr(torch, dtype),
                                           on_done=functools.partial(sampling_readout, ex=ex), partition=partition,
                                           file_name=served_name(info["path"], ex))
        note, extra = connection_readout(ex)
        b = ex.last_health["B"]
        rec = StageRecord("", "connect", "B", b.get("hostname") or b["node_ip"], w0, time.time(),
                          compute_s=time.perf_counter() - t0,
                          note=f"{note}; ComfyUI's MODEL of {served_name(info['path'], ex)}")
        ui = report("H3RemoteModel", unique_id, [rec], "connect", extra={**extra, "status": rec.note})
        return {"ui": ui, "result": (patcher,)}


def live_sampling(ex):
    """``open_sampling`` of the MODEL ComfyUI caches: each sampling checks B first and finds its worker again
    (:func:`session.live`: restarted, released, a new connection), and its readout says what changed."""
    def open_sampling():
        live, note = session.live(ex)
        sampling = live.open_sampling()
        sampling.b_note = note
        return sampling
    return open_sampling


log = logging.getLogger("comfy_h3.nodes")
#: where a name B refuses came from, as its sentence says
ASKED_BY = "H3RemoteModel's unet_name"


def unet_names(models: list[str]) -> list[str]:
    """The picker's choices: B's transformer files as ComfyUI's UNETLoader names them (relative to the
    ``diffusion_models`` folder they lie in, whatever root B was set up with), then the tiny ones when B has none."""
    files = [catalog.comfy_dit_name(m) for m in models if m.endswith((".safetensors", ".gguf"))]
    return list(dict.fromkeys(files)) or list(models)


def served_name(path: str, ex) -> str:
    """The file B serves, by the picker's name for it (B's roots, else A's: the embedded B)."""
    return catalog.comfy_dit_name(catalog.name_under(path, getattr(ex, "_b_roots", None) or a_model_roots()))


#: core's LoRA loaders of a model: (file input, strength input)
LORA_LOADERS = {"LoraLoaderModelOnly": ("lora_name", "strength_model"), "LoraLoader": ("lora_name", "strength_model")}


def loras_upstream(prompt: dict | None, node: str | None) -> list[tuple[str, float]]:
    """The LoRAs core's loaders put on the model the sampler ``node`` runs, from the API ``prompt``: ``(file,
    strength)`` from the model's loader outward (the order they apply)."""
    if not prompt or node is None or str(node) not in prompt:
        return []
    found, seen, todo = [], set(), [str(node)]
    while todo:
        nid = todo.pop(0)
        if nid in seen or nid not in prompt:
            continue
        seen.add(nid)
        entry = prompt[nid] if isinstance(prompt[nid], dict) else {}
        inputs = entry.get("inputs") or {}
        names = LORA_LOADERS.get(entry.get("class_type"))
        if names and isinstance(inputs.get(names[0]), str):
            try:
                found.append((inputs[names[0]], float(inputs.get(names[1], 1.0))))
            except (TypeError, ValueError):
                found.append((inputs[names[0]], 1.0))
        todo += [str(v[0]) for v in inputs.values() if isinstance(v, list) and len(v) == 2 and isinstance(v[1], int)]
    return found[::-1]


def sampling_readout(summary: dict, ex=None) -> None:
    """The readout of one sampling on the sampler node that drove B (the node ComfyUI executes now): forwards, B's
    compute and the two hand-offs per forward and in all, the LoRAs with their strengths and a reload after a
    release, as an ``h3.timing`` record kept for the export. With ``parallel``, A's DiT rank ``ex`` started is
    registered with the host (ComfyUI's /free and its eviction release it, as after the pack's own denoise)."""
    h = host()
    if ex is not None and ex.bclient.parallel != "off":
        try:
            held = session.a_rank_held(ex)
        except Exception as exc:  # noqa: BLE001 - the sampling's readout still goes out; said in the log
            log.warning("comfy-h3: A's DiT rank did not say what it holds (%s); ComfyUI's /free skips it", exc)
            held = None
        if held is not None:
            h.hold_a_rank(*held)
    node = h.executing_node()
    tot, per, n = summary["total"], summary["per_forward"], summary["forwards"]
    t0, group = summary["started"], summary.get("parallel")
    on = " + ".join(group["ranks"]) if group else f"B ({summary['worker']})"
    note = (f"{n} forwards on {on}: B compute {tot.get('compute_s', 0):.2f} s, "
            f"A->B {tot.get('a_to_b_s', 0):.3f} s, B->A {tot.get('b_to_a_s', 0):.3f} s in all; per forward "
            f"{per.get('compute_s', 0):.3f} s compute, {per.get('a_to_b_s', 0) + per.get('b_to_a_s', 0):.4f} s "
            "transfer") if n else "no forward ran on B"
    if group:
        formed = f", formed in {group['formed_s']:.2f} s for this sampling" if group.get("formed_s") else ""
        if group.get("a_start_s"):
            formed += f" (A's DiT rank started and loaded first: {group['a_start_s']:.1f} s of the sampler's time)"
        note += f"; parallel: {group['method']} over {len(group['ranks'])} ranks{formed}"
    reloaded = {**((group or {}).get("reloaded_s") or {}), **(summary.get("reloaded_s") or {})}
    for machine, seconds in sorted(reloaded.items()):
        note += f"; {machine} reloaded its DiT first ({seconds:.2f} s: it had been released)"
    loras = loras_upstream(h.running_prompt(), node)
    if loras:
        note += "; LoRA " + ", ".join(f"{name} at {strength:g}" for name, strength in loras)
    if summary.get("rerun"):
        note += f"; {summary['rerun']}"
    if summary.get("b_note"):
        note += f"; {summary['b_note']}"
    rec = StageRecord(summary["sampling_id"], "sampling", "B", summary["worker"], t0, t0 + summary["wall_s"],
                      compute_s=tot.get("compute_s", 0.0), fetch_s=tot.get("a_to_b_s", 0.0) + tot.get("b_to_a_s", 0.0),
                      bytes={"a_to_b": tot.get("bytes_a_to_b", 0), "b_to_a": tot.get("bytes_b_to_a", 0)},
                      steps=tuple(r["compute_s"] for r in summary["records"]), note=note,
                      info={k: summary.get(k) for k in ("forwards", "total", "per_forward", "worker", "lora_modules",
                                                        "lora_bytes_fetched", "parallel", "rerun", "ranks_compute_s",
                                                        "b_note")})
    report("sampler", node, [rec], "sampling", extra={"status": note})
