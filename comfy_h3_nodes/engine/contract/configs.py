"""What both machines and every caller agree on before anything runs: names, choices and the settings of each side.

No Ray, no torch: the node layer reads these at ComfyUI's load (its widgets' choices), B's command line reads them,
and the executor hands :class:`SideConfig` / :class:`BConfig` to the actors as plain dicts.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the Ray namespace of the pack's named actors
NAMESPACE = "comfy_h3"
#: the model choice that is the pack's own tiny random checkpoint, built on first use on each machine
TINY = "tiny-random"
#: the same tiny model in FastVideo's FastH3 layout (VSA gates in every block, a VSA config), built on first use too
TINY_FASTH3 = "tiny-random-fasth3"

WORKFLOWS = ("t2va", "fl2va", "ref2va")
#: the transformer partition each workflow runs on B
PARTITION_OF = {"t2va": "transformer", "fl2va": "transformer", "ref2va": "transformer_ref"}
PARTITIONS = ("transformer", "transformer_ref")

#: components each side loads from a diffusers checkpoint folder (the processors diffusers creates from config)
A_COMPONENTS = ("text_encoder", "tokenizer", "processor", "vae", "audio_vae")
SCHEDULERS = ("scheduler", "audio_scheduler")
MODEL_INDEX = "modular_model_index.json"
#: components that hold weights (what the memory plans count); A's are the first three
MODEL_COMPONENTS = ("text_encoder", "vae", "audio_vae", "transformer", "transformer_ref")
MODEL_COMPONENTS_A = ("text_encoder", "vae", "audio_vae")

DTYPES = ("float32", "bfloat16", "float16")
#: how B stores the transformer: the load dtype ("auto"; a GGUF as stored), bf16, fp8 storage, GGUF
PRECISIONS = ("auto", "bf16", "fp8", "gguf")
#: where a request's video is decoded: auto (split with B when it pays), A alone, or split whenever B can
DECODE_ON = ("auto", "A", "A+B")
#: which machines denoise one request together: one worker, A's rank with one B, A's rank with every B, or the
#: fastest choice the memory plans and the queue allow
PARALLEL = ("off", "A+B", "all", "auto")
#: the groups ComfyUI's own samplers (H3RemoteModel) run each forward on: auto's model is per request, not per forward
SAMPLER_PARALLEL = ("off", "A+B", "all")
#: how a DiT group splits attention (diffusers' context parallelism)
PARALLEL_METHODS = ("ulysses", "ring")


@dataclass
class SideConfig:
    """A's side (text encoder, VAEs), as its actor or the in-process A loads it."""

    model_dir: str
    dtype: str = "bfloat16"
    attention_backend: str = "sdpa"
    device: str | None = None
    threads: int | None = None


@dataclass
class BConfig(SideConfig):
    """One DiT worker on a B machine (``remote_worker setup`` and the executor's embedded mode start it from this)."""

    partition: str = "transformer"
    #: storage precision of the transformer on B: "auto" (dtype; GGUF as stored), "bf16", "fp8", "gguf"
    precision: str = "auto"
    name: str = "h3_dit"
    namespace: str = NAMESPACE
    allow_swap: bool = True
    max_restarts: int = -1
    #: B's video VAE decoder for split decode: "auto" (when B's memory plan fits it) or "off"
    decoder: str = "auto"
    #: FastH3 (VSA) checkpoints: the block-sparse kernel ("auto", "torch", "triton", "fastvideo"; None:
    #: $H3_VSA_KERNEL, else auto). See engine/model/vsa_kernels.py.
    vsa_kernel: str | None = None
    #: where a worker with no model roots of its own looks up a model name (``MiniMax-H3``, relative as the pickers
    #: list it): A's model roots, which the embedded cluster's B and A's DiT rank share; B's own roots come first
    search_roots: tuple = ()
    #: the node and input the model name came from, as B's refusal of a name names it ("" : H3RemoteDiT's model_path)
    asked_by: str = ""


@dataclass
class Timeouts:
    """Every remote wait of a request is bounded by one of these (seconds)."""

    start: float = 900.0       # loading a model (62 GB text encoder) on actor start
    health: float = 10.0       # a health or progress call
    encode: float = 900.0
    handoff: float = 300.0     # a receiver waiting for / fetching a payload
    stall: float = 900.0       # B making no step progress
    decode: float = 900.0
    poll: float = 0.1          # progress polling period
