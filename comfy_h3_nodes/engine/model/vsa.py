"""VSA-H3: video sparse attention for MiniMax-H3's packed sequence, as a diffusers attention processor.

The algorithm is FastVideo's (``fastvideo/attention/backends/video_sparse_attn_h3.py``; read, not copied), written here
from its description; ``tests/test_vsa.py`` checks it against FastVideo's own functions.

Tiles. The packed sequence is ``[text | condition video rows | audio | target video]`` (diffusers'
``MiniMaxH3*PrepareLayoutStep``; ref2va: ``[text | references | target audio | target video]``). Its prefix is cut
into 1-D chunks of ``E`` rows (64 or 256) that never cross the three segment lengths
``(n_text, n_condition_video, n_audio)`` (FastVideo's split, also for ref2va); the target video, the tail, in 3-D tiles
of ``4x4x4`` (E 64) or ``4x8x8`` (E 256) latent tokens over its ``(T, Hp, Wp)`` grid, smaller where a dimension does
not divide. Tiles are ordered prefix first, then video tiles t-major; within a tile rows keep their packed order.

Selection. Queries and keys are mean-pooled per tile (fp32); ``scores = pooled_q @ pooled_k^T / sqrt(D)`` per batch
item, head and tile pair. Each video query tile keeps its top ``ceil((1 - sparsity) * NV)`` video key tiles
(:func:`k_video`) and, in ``exempt`` mode, every prefix key tile (``compete``: prefix tiles compete in one top-k of
``k + P``). Prefix queries stay dense. Attention then runs over the kept tiles only, at scale ``1/sqrt(D)``.

Compression branch. ``softmax(scores) @ pooled_v`` (dense over all tiles, fp32) is broadcast to every row of its query
tile, scaled elementwise by the gate ``to_gate_compress(hidden_states)`` (the attention input, before QK-norm and
RoPE; no activation) and added to the sparse output before ``to_out``. It runs at every sparsity.

Where the layout comes from: the transformer's ``forward`` receives ``position_ids`` and the text, audio and video row
indices; a forward pre-hook (:meth:`VSAState.pre_hook`) derives the segments and the target video's grid from them
(the tail of ``video_indices``, its ``(t, h, w)`` positions) before the blocks run, once per forward. The processor
raises when it has none or the sequence differs: it never falls back to dense attention.

Kernels (:mod:`.vsa_kernels`): ``torch`` (any device: tiles gathered into SDPA, no token mask) or FastVideo's
CUDA block-sparse kernels (``fastvideo_kernel``: Triton, or its own dispatch).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import pathlib
from dataclasses import dataclass, field

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb
from safetensors import safe_open

from ..contract.errors import ModelFolderError
from .fasth3 import GATE_MODULE, GATE_SUFFIX, TILE_SHAPES, VSASettings


class VSALayoutError(RuntimeError):
    """A forward the VSA processor cannot tile (no layout, or one that is not MiniMax-H3's packed sequence)."""


# ---------------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Layout:
    """One forward's packed sequence as VSA tiles it."""

    segments: tuple[int, ...]  # (n_text, n_condition_video, n_audio): the prefix, as FastVideo chunks it
    grid: tuple[int, int, int]  # (T, Hp, Wp) of the target video (the sequence's tail)

    @property
    def length(self) -> int:
        return sum(self.segments) + math.prod(self.grid)


def _leading_run(values: torch.Tensor) -> int:
    """How many leading entries equal the first."""
    same = (values == values[0]).to(torch.int64)
    return int(same.cumprod(0).sum())


def layout_of(position_ids: torch.Tensor, text_indices: torch.Tensor, audio_indices: torch.Tensor,
              video_indices: torch.Tensor) -> Layout:
    """The layout of one forward of ``MiniMaxH3Transformer3DModel`` from its arguments: the target video is the run of
    ``video_indices`` that ends the sequence; its frames, rows and columns are read from its ``(t, h, w)``
    positions (raster order), and checked to form a ``(T, Hp, Wp)`` grid."""
    seq = int(position_ids.shape[0])
    vid = video_indices.detach().to("cpu", torch.int64)
    if vid.numel() == 0 or int(vid[-1]) != seq - 1:
        raise VSALayoutError(f"the packed sequence ({seq} rows) does not end with its target video rows (last video "
                             f"row {int(vid[-1]) if vid.numel() else None}): it is not MiniMax-H3's layout.")
    breaks = torch.nonzero(vid[1:] - vid[:-1] != 1).flatten()
    start = int(breaks[-1]) + 1 if breaks.numel() else 0
    tail = vid.numel() - start
    pos = position_ids[seq - tail:].detach().to("cpu", torch.float64)
    frame = _leading_run(pos[:, 0])
    width = _leading_run(pos[:frame, 1])
    if frame % width or tail % frame:
        raise VSALayoutError(f"the target video's {tail} rows are not a raster of frames ({frame} rows with the "
                             f"first time position, {width} with the first row position).")
    grid = (tail // frame, frame // width, width)
    g = pos.view(*grid, 3)
    ok = (bool((g[..., 0] == g[:, :1, :1, 0]).all()) and bool((g[..., 1] == g[:1, :, :1, 1]).all())
          and bool((g[..., 2] == g[:1, :1, :, 2]).all()))
    if not ok:
        raise VSALayoutError(f"the target video's positions do not form a {grid} (T, H, W) raster.")
    layout = Layout((int(text_indices.numel()), vid.numel() - tail, int(audio_indices.numel())), grid)
    if layout.length != seq:
        raise VSALayoutError(f"text {layout.segments[0]} + condition {layout.segments[1]} + audio "
                             f"{layout.segments[2]} + video {math.prod(grid)} rows != the sequence's {seq}.")
    return layout


# ---------------------------------------------------------------------------------------------------- geometry
@dataclass(frozen=True)
class Geometry:
    """Tiles of one layout. ``tile`` [S]: each packed row's tile; ``sizes`` [n]: valid rows per tile; ``slot``
    [S]: each row's place in a tile buffer of ``E`` rows per tile (``tile * E + rank in its tile``)."""

    layout: Layout
    tile_size: int
    tile: torch.Tensor
    sizes: torch.Tensor
    slot: torch.Tensor
    prefix_tiles: int
    video_tiles: int

    @property
    def n(self) -> int:
        return self.prefix_tiles + self.video_tiles

    @property
    def prefix_rows(self) -> int:
        return sum(self.layout.segments)

    @property
    def length(self) -> int:
        return int(self.tile.numel())

    def describe(self) -> str:
        return f"{self.prefix_tiles} prefix + {self.video_tiles} video tiles of {self.tile_size} over {self.length} rows"


def _extent(length: int, tile: int) -> list[int]:
    return [min(tile, length - i * tile) for i in range(math.ceil(length / tile))]


@functools.lru_cache(maxsize=16)
def geometry(segments: tuple[int, ...], grid: tuple[int, int, int], tile_size: int,
             device: str = "cpu") -> Geometry:
    """The tiles of a layout: 1-D prefix chunks inside each non-empty segment, then the video's 3-D tiles."""
    if tile_size not in TILE_SHAPES:
        raise ValueError(f"VSA tile size is {tile_size}; expected one of {sorted(TILE_SHAPES)}.")
    e = tile_size
    tiles, sizes, base = [], [], 0
    for seg in (s for s in segments if s > 0):
        tiles.append(base + torch.arange(seg) // e)
        sizes.extend(_extent(seg, e))
        base += math.ceil(seg / e)
    prefix = base
    (T, H, W), (ts, hs, ws) = grid, TILE_SHAPES[e]
    et, eh, ew = _extent(T, ts), _extent(H, hs), _extent(W, ws)
    t, h, w = torch.meshgrid(torch.arange(T), torch.arange(H), torch.arange(W), indexing="ij")
    tiles.append(prefix + ((t // ts) * len(eh) + h // hs) * len(ew) + w // ws)
    sizes.extend(a * b * c for a in et for b in eh for c in ew)
    tile = torch.cat([x.reshape(-1) for x in tiles])
    order = torch.argsort(tile, stable=True)  # rows in tile order, packed order inside a tile
    counts = torch.tensor(sizes)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(tile)
    rank[order] = torch.arange(tile.numel()) - starts[tile[order]]
    return Geometry(Layout(tuple(segments), tuple(grid)), e, tile.to(device), counts.to(device),
                    (tile * e + rank).to(device), prefix, len(sizes) - prefix)


def k_video(sparsity: float, video_tiles: int) -> int:
    """Video key tiles each video query tile keeps (FastVideo's arithmetic, in Python floats)."""
    return max(1, min(math.ceil((1 - sparsity) * video_tiles), video_tiles))


# ---------------------------------------------------------------------------------------------------- selection
def pool(x: torch.Tensor, geo: Geometry) -> torch.Tensor:
    """Per-tile means of ``x`` [B, S, H, D] in fp32: [B, H, n, D]."""
    b, s, h, d = x.shape
    acc = torch.zeros(b, geo.n, h, d, dtype=torch.float32, device=x.device)
    acc.index_add_(1, geo.tile, x.float())
    return (acc / geo.sizes.to(acc).view(1, -1, 1, 1)).permute(0, 2, 1, 3)


def tile_scores(q: torch.Tensor, k: torch.Tensor, geo: Geometry) -> torch.Tensor:
    """``pooled_q @ pooled_k^T / sqrt(D)`` in fp32: [B, H, n, n]."""
    return pool(q, geo) @ pool(k, geo).transpose(-2, -1) / math.sqrt(q.shape[-1])


def block_mask(scores: torch.Tensor, prefix_tiles: int, video_tiles: int, sparsity: float,
               exempt: bool = True) -> torch.Tensor:
    """Which key tiles each query tile attends to (bool [B, H, n, n]): dense prefix query rows; per video query
    tile its top ``k_video`` video tiles plus every prefix tile (``exempt``), or the top ``k_video + P`` of all."""
    kv = k_video(sparsity, video_tiles)
    if kv == video_tiles:
        return torch.ones_like(scores, dtype=torch.bool)
    mask = torch.zeros_like(scores, dtype=torch.bool)
    if exempt or prefix_tiles == 0:
        mask.scatter_(-1, scores[..., prefix_tiles:].topk(kv, dim=-1).indices + prefix_tiles, True)
        mask[..., :prefix_tiles] = True
    else:
        mask.scatter_(-1, scores.topk(min(kv + prefix_tiles, scores.shape[-1]), dim=-1).indices, True)
    mask[:, :, :prefix_tiles, :] = True
    return mask


def token_mask(mask: torch.Tensor, geo: Geometry) -> torch.Tensor:
    """The tile mask as a token mask [B, H, S, S] (for references at small sizes)."""
    return mask[:, :, geo.tile][:, :, :, geo.tile]


def compression(scores: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, geo: Geometry,
                dtype: torch.dtype) -> torch.Tensor:
    """The gated compression branch, per row [B, S, H, D]: ``softmax(scores) @ pooled_v`` at each row's tile, times
    the gate."""
    out_c = (torch.softmax(scores, dim=-1) @ pool(v, geo)).to(dtype)  # [B, H, n, D]
    return out_c[:, :, geo.tile].transpose(1, 2) * gate


def vsa_attention(q, k, v, gate, geo: Geometry, sparsity: float, exempt: bool, kernel, dense=None) -> tuple:
    """VSA-H3 over [B, S, H, D] tensors (``gate``: the same shape, or None): ``(output [B, S, H, D], mask)``.
    ``kernel`` runs the block-sparse part (:mod:`.vsa_kernels`); ``dense(q, k, v)`` any dense attention it needs."""
    if q.shape[1] != geo.length:
        raise VSALayoutError(f"VSA was set up for {geo.length} rows ({geo.describe()}) and got {q.shape[1]}.")
    scores = tile_scores(q, k, geo)
    mask = block_mask(scores, geo.prefix_tiles, geo.video_tiles, sparsity, exempt)
    out = kernel.run(q, k, v, mask, geo, dense or sdpa)
    if gate is not None:
        out = out + compression(scores, v, gate, geo, out.dtype)
    return out, mask


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain dense attention over [B, S, H, D] tensors."""
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


# ---------------------------------------------------------------------------------------------------- processor
@dataclass
class VSAState:
    """What every VSA processor of one transformer shares: its settings, the kernel, this forward's tiles, and what
    the last forwards selected (for the readout)."""

    settings: VSASettings
    kernel: object
    geometry: Geometry | None = None
    gates_active: bool = True
    forwards: int = 0
    kept: list = field(default_factory=list)  # fraction of video (query, key) tile pairs kept, per layer call

    def pre_hook(self, module, args, kwargs):
        """Forward pre-hook of the transformer: this forward's layout, before any block runs."""
        bound = _bind(module, args, kwargs)
        layout = layout_of(bound["position_ids"], bound["text_indices"], bound["audio_indices"],
                           bound["video_indices"])
        self.geometry = geometry(layout.segments, layout.grid, self.settings.tile_size,
                                 str(bound["position_ids"].device))
        self.forwards += 1
        return None

    def sparsity(self, layer: int) -> float:
        return 0.0 if layer in self.settings.dense_layers else self.settings.sparsity

    def note(self) -> str:
        s = self.settings
        kept = f"; kept {100 * sum(self.kept) / len(self.kept):.1f}% of video tile pairs" if self.kept else ""
        geo = f"; {self.geometry.describe()}" if self.geometry is not None else ""
        gates = "" if self.gates_active else "; gates all zero: no compression branch"
        return (f"VSA-H3 ({s.describe()}); kernel {self.kernel.label}{geo}{kept}{gates}")

    def take_stats(self) -> dict:
        out = {"forwards": self.forwards, "kept": (sum(self.kept) / len(self.kept)) if self.kept else None}
        self.forwards, self.kept = 0, []
        return out


def _bind(module, args, kwargs) -> dict:
    """The forward's arguments by name, however the caller passed them (diffusers' denoiser: all by keyword)."""
    return _signature(type(module)).bind_partial(module, *args, **kwargs).arguments


@functools.lru_cache(maxsize=4)
def _signature(cls):
    return inspect.signature(cls.forward)


class H3VSAProcessor:
    """The attention of one main block of ``MiniMaxH3Transformer3DModel`` under VSA-H3: the projections, QK-norm and
    RoPE of diffusers' ``MiniMaxH3AttnProcessor``, then :func:`vsa_attention` with the block's gate."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, state: VSAState, layer: int):
        self.state, self.layer = state, layer

    def _dense(self, q, k, v):
        return dispatch_attention_fn(q, k, v, backend=self._attention_backend)

    def __call__(self, attn, hidden_states, rotary_emb=None, attention_mask=None):
        state = self.state
        if state.geometry is None:
            raise VSALayoutError("the VSA processor ran without a layout: the transformer's forward pre-hook did not "
                                 "run (call the transformer itself, not its blocks).")
        if attention_mask is not None:
            raise VSALayoutError("VSA-H3 takes no attention mask (MiniMax-H3 packs one document per sequence).")
        if self._parallel_config is not None:
            raise VSALayoutError("VSA-H3 tiles the whole packed sequence: it does not run under diffusers' context "
                                 "parallelism (a split sequence); run the FastH3 transformer on one device.")
        if attn.fused_projections:
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        query, key, value = (x.unflatten(-1, (attn.heads, -1)) for x in (query, key, value))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if rotary_emb is not None:
            query, key = _apply_rotary_emb(query, *rotary_emb), _apply_rotary_emb(key, *rotary_emb)
        gate = None
        if state.gates_active:
            gate = getattr(attn, GATE_MODULE)(hidden_states).unflatten(-1, (attn.heads, -1))
        out, mask = vsa_attention(query, key, value, gate, state.geometry, state.sparsity(self.layer),
                                  state.settings.mode == "exempt", state.kernel, self._dense)
        geo, p = state.geometry, state.geometry.prefix_tiles
        if geo.video_tiles and state.settings.mode == "exempt":  # exactly k of NV video key tiles per video query
            state.kept.append(k_video(state.sparsity(self.layer), geo.video_tiles) / geo.video_tiles)
        elif geo.video_tiles:
            state.kept.append(float(mask[:, :, p:, p:].float().mean()))
        out = out.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


# ---------------------------------------------------------------------------------------------------- install
def add_gate_projections(model) -> None:
    """Give every main block's attention its VSA gate (``Linear(hidden, heads * head_dim, bias=False)``), at the
    dtype and on the device of the block's ``to_q``."""
    for block in model.transformer_blocks:
        attn = block.attn
        ref = attn.to_q.weight
        setattr(attn, GATE_MODULE, torch.nn.Linear(attn.to_q.in_features, attn.inner_dim, bias=False,
                                                   dtype=ref.dtype, device=ref.device))


def load_gates(model, folder: pathlib.Path) -> int:
    """Copy every ``transformer_blocks.{i}.attn.to_gate_compress.weight`` from the folder's shards (the index's
    weight map names the shard) into the model, and check each one arrived with its shape. ``from_pretrained`` drops
    these keys (diffusers' model has no such module), so they are loaded here, by name."""
    want = {f"transformer_blocks.{i}{GATE_SUFFIX}": getattr(b.attn, GATE_MODULE).weight
            for i, b in enumerate(model.transformer_blocks)}
    where: dict[str, list[str]] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            for name in fh.keys():
                if name in want:
                    where.setdefault(str(f), []).append(name)
    loaded = set()
    for path, names in where.items():
        with safe_open(path, framework="pt", device="cpu") as fh:
            for name in names:
                value, param = fh.get_tensor(name), want[name]
                if tuple(value.shape) != tuple(param.shape):
                    raise ModelFolderError(f"{path}: `{name}` is {tuple(value.shape)}; the transformer's gate is "
                                           f"{tuple(param.shape)}: the folder is another size of FastH3.")
                with torch.no_grad():
                    param.copy_(value.to(param.dtype))
                loaded.add(name)
    missing = sorted(set(want) - loaded)
    if missing:
        raise ModelFolderError(f"{folder} lacks {len(missing)} of {len(want)} VSA gates (`{missing[0]}` first): "
                               "the FastH3 folder is incomplete; copy all its shards.")
    return len(loaded)


def install(model, settings: VSASettings, kernel, folder: pathlib.Path) -> VSAState:
    """Make ``model`` (a FastH3 partition loaded by ``from_pretrained``) run VSA-H3: its gates loaded from
    ``folder``, a :class:`H3VSAProcessor` on every main block (the token refiner keeps diffusers' processor), and
    the pre-hook that tiles each forward."""
    add_gate_projections(model)
    n = load_gates(model, folder)
    logging.getLogger("comfy_h3.B").info(
        "FastH3 %s: loaded its %d VSA gates by name (diffusers' 'weights not used' warning is about them)", folder, n)
    active = any(bool((getattr(b.attn, GATE_MODULE).weight != 0).any()) for b in model.transformer_blocks)
    state = VSAState(settings, kernel, gates_active=active)
    for i, block in enumerate(model.transformer_blocks):
        block.attn.set_processor(H3VSAProcessor(state, i))
    model.h3_vsa = state
    model.register_forward_pre_hook(state.pre_hook, with_kwargs=True)
    return state
