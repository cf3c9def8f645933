"""Split decode: the video VAE's temporal clips decoded on both machines and blended on A, bit for bit.

Data contract (shared/design.md sections 1, 2 and 8):

* input: the still normalised B->A ``latents`` (1, 24, F', H/16, W/16) fp32 of one request (``wire.DenoisedLatents``),
  the same tensor on both machines (B reads it from its own object store; it never waits for the B->A hand-off);
* clips: diffusers' ``AutoencoderKLMiniMaxH3._decode`` de-normalises the latents and decodes them in ``num_clips``
  independent temporal clips (``_decode_clip`` over ``tokens_chunk_size + token_overlap`` latent frames each,
  spatially tiled), then cross-fades consecutive clips over ``frame_overlap`` pixel frames. Clip ``i``'s raw output is
  (1, 3, 4 x 7, H, W) in the VAE's compute dtype; 124 frames are 7 clips, 345 frames 20;
* a decode share (:func:`decode_share`, run by B, and by A in its tests) is clips ``[start, stop)`` decoded with the
  real ``_decode_clip``; B's clips cross to A one object per clip (``wire.DecodedClip``). Where the shares meet
  inside a clip (``first_tile``), B decodes only that clip's spatial tiles from ``first_tile`` on (:class:`Tiles`,
  each tile's input from diffusers' own ``_split_tiles``) and A runs the real ``_decode_clip`` on it with its decoder
  answering those tiles from B's (each tile's decoder input checked equal), so the stitching is diffusers' code too;
* the blend (:func:`serve_clips`) runs diffusers' own decode blocks on A unchanged (latent de-normalisation,
  ``vae.decode`` with its clip loop and cross-fade, the pixel de-normalisation, ``postprocess_video``, the audio
  decode) with ``vae._decode_clip`` answering each clip index from a provider: B's clips come from B's share, every
  other clip is decoded there by the real ``_decode_clip`` (A's share, or B's clips when B's share was lost). Every
  clip's input is checked equal to the one diffusers hands over, so a diffusers release that slices its clips
  differently fails loudly instead of blending wrong frames.

Only the clip inputs (:func:`clip_inputs`: de-normalise, cast, pad, slice) restate diffusers' arithmetic, because B
needs them without running the loop; the check above compares them with diffusers' own on every split decode. The
cross-fade itself is diffusers' code, never restated here.

The share policy (:mod:`comfy_h3_nodes.engine.executor.decode_plan`, :func:`choose_b_clips` there, in tiles): B decodes
the last ``k`` tiles, A the first ones and then blends, so A's own clips never wait for B's; ``k`` minimises the
predicted finish ``max(A's clips, B's clips - B's lead + fetching B's frames)`` (A pulls B's frames while it decodes its
own) from each side's measured seconds per clip (:class:`ClipClock`): a slower side gets fewer clips.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import pathlib
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from diffusers.models.modeling_utils import get_parameter_dtype

from ..contract.errors import DecodeCancelled

class SplitDecodeError(RuntimeError):
    """The split decode cannot be bit-identical (diffusers sliced a clip differently, or a share is malformed)."""


# ---------------------------------------------------------------------------------------------------- clip geometry
def geometry(vae) -> dict:
    """The VAE's temporal chunking as diffusers derives it (what :func:`clips_for` needs, without the VAE) and its
    spatial tiling (``use_tiling``, the compression ratio, tile height and width, their least overlaps: what
    :func:`tiles_for` needs; both machines must agree on it, or their clips differ)."""
    return {"tokens_chunk_size": int(vae.tokens_chunk_size), "token_drop": int(vae.config.token_drop),
            "tiling": [bool(vae.use_tiling), int(vae.spatial_compression_ratio), int(vae.tile_sample_min_height),
                       int(vae.tile_sample_min_width), int(vae.tile_sample_min_overlap_height),
                       int(vae.tile_sample_min_overlap_width)]}


def clips_for(geom: dict, latent_frames: int) -> int:
    """How many clips ``vae._decode`` decodes for ``latent_frames`` (its own loop bound)."""
    tcs, drop = geom["tokens_chunk_size"], geom["token_drop"]
    tokens = latent_frames + drop
    return (tokens + (-tokens) % tcs) // tcs - int(drop > 0)


def tiles_for(geom: dict, height: int, width: int) -> int:
    """How many spatial tiles ``_decode_clip`` decodes per clip of a ``height`` x ``width`` canvas (the count of
    diffusers' ``_split_tiles``; the tiles themselves always come from diffusers' own ``_split_tiles``)."""
    tiling = geom.get("tiling")
    if not tiling or not tiling[0]:
        return 1
    _, _, tile_h, tile_w, overlap_h, overlap_w = tiling

    def count(length: int, size: int, overlap: int) -> int:
        if size >= length:
            return 1
        n = math.ceil(length / size)
        while size * n - overlap * (n - 1) < length:
            n += 1
        return n

    return count(height, tile_h, overlap_h) * count(width, tile_w, overlap_w)


def num_clips(vae, latent_frames: int) -> int:
    return clips_for(geometry(vae), latent_frames)


def vae_fingerprint(folder: str | os.PathLike) -> str:
    """A cheap identity of a video VAE folder: its config, each weight file's size and header, and the first and last
    64 KiB of its data. Two machines split a decode only when their fingerprints (and dtypes) agree: the frames are
    bit-identical only from the same weights."""
    root = pathlib.Path(folder)
    h = hashlib.sha256()
    cfg = root / "config.json"
    h.update(cfg.read_bytes() if cfg.is_file() else b"")
    for f in sorted(root.glob("*.safetensors")):
        size = f.stat().st_size
        with open(f, "rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            h.update(str(size).encode() + head + fh.read(min(n, 1 << 24)) + fh.read(1 << 16))
            fh.seek(max(size - (1 << 16), 0))
            h.update(fh.read(1 << 16))
    return h.hexdigest()[:16]


def clip_inputs(vae, latents) -> list:
    """The input of each clip as diffusers' decode block and ``_decode`` build it: ``latents * std + mean`` (the
    block), cast to the decoder's dtype (``decode``), the last latent frame repeated up to whole chunks and the
    ``tokens_chunk_size + token_overlap`` frame window of each clip (``_decode``)."""
    device = next(vae.post_quant_conv.parameters()).device
    latents = latents.to(device)
    mean = torch.tensor(vae.config.latents_mean, device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=device).view(1, -1, 1, 1, 1)
    z = (latents * std + mean).to(get_parameter_dtype(vae.post_quant_conv))
    tcs, drop = vae.tokens_chunk_size, vae.config.token_drop
    pad = (-(z.shape[2] + drop)) % tcs
    if pad > 0:
        z = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad, 1, 1)], dim=2)
    return [z[:, :, i * tcs: i * tcs + tcs + vae.token_overlap] for i in range(num_clips(vae, latents.shape[2]))]


def tile_inputs(vae, z) -> list:
    """The latent input of each spatial tile of one clip's input ``z``, in ``_decode_clip``'s order (rows, then
    columns), from diffusers' own ``_split_tiles``; the whole ``z`` when the VAE does not tile."""
    if not vae.use_tiling:
        return [z]
    r = vae.spatial_compression_ratio
    ys, hs, _ = vae._split_tiles(z.shape[-2] * r, vae.tile_sample_min_height, vae.tile_sample_min_overlap_height)
    xs, ws, _ = vae._split_tiles(z.shape[-1] * r, vae.tile_sample_min_width, vae.tile_sample_min_overlap_width)
    return [z[..., y // r: y // r + h // r, x // r: x // r + w // r] for y, h in zip(ys, hs) for x, w in zip(xs, ws)]


def _decode_tile(vae, tile):
    return vae.decoder(vae.post_quant_conv(tile))  # what ``_decode_clip`` runs on each tile


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------------- a share
@dataclass(frozen=True)
class Tiles:
    """Tiles ``[first, count)`` of one clip decoded on their own (B's part of the clip where the two shares meet):
    the decoder's raw outputs, one per tile along dim 0 (each ``(1, 3, frames, tile_h, tile_w)``). ``tiles`` is the
    tensor, or a call that returns it (``None`` when it will not come: A then decodes those tiles too) and is made
    only when the first of them is needed, so A decodes its own tiles of the clip first."""

    first: int
    tiles: object  # a tensor (count - first, 3, frames, tile_h, tile_w), or a call returning one or None

    def get(self):
        return self.tiles() if callable(self.tiles) else self.tiles


@dataclass
class Share:
    """Clips ``[start, stop)`` of one request, decoded; ``seconds`` per clip. With ``first_tile`` > 0 the first
    clip is only its tiles ``[first_tile, tiles)`` (a :class:`Tiles`): A decodes the rest of it."""

    start: int
    stop: int
    of: int
    clips: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    first_tile: int = 0
    tiles: int = 1

    @property
    def compute_s(self) -> float:
        return float(sum(self.seconds))


def decode_share(vae, latents, start: int, stop: int, should_cancel: Callable[[], bool] | None = None,
                 first_tile: int = 0) -> Share:
    """Clips ``[start, stop)`` of ``latents`` (normalised, as B->A) with the real ``_decode_clip``; with
    ``first_tile`` > 0, of clip ``start`` only its tiles from ``first_tile`` on (a :class:`Tiles`)."""
    with torch.no_grad():
        inputs = clip_inputs(vae, latents)
        n = len(inputs)
        if not 0 <= start <= stop <= n:
            raise SplitDecodeError(f"decode share [{start}, {stop}) is outside the request's {n} clips.")
        tiles = tile_inputs(vae, inputs[start]) if first_tile and start < stop else []
        if first_tile and not 0 < first_tile < len(tiles):
            raise SplitDecodeError(f"decode share from tile {first_tile} of clip {start}: the clip has {len(tiles)} "
                                   "tiles.")
        share = Share(start, stop, n, first_tile=first_tile, tiles=max(len(tiles), 1))
        for i in range(start, stop):
            if should_cancel is not None and should_cancel():
                raise DecodeCancelled(f"decode share stopped before clip {i + 1}/{n}: the request was cancelled")
            _sync(inputs[i].device)  # the clip's own time: nothing queued before it (the latents' normalisation)
            t0 = time.perf_counter()
            if i == start and first_tile:
                clip = Tiles(first_tile, torch.cat([_decode_tile(vae, t) for t in tiles[first_tile:]]))
                _sync(clip.tiles.device)
            else:
                clip = vae._decode_clip(inputs[i])
                _sync(clip.device)
            share.seconds.append(time.perf_counter() - t0)
            share.clips.append(clip)
    return share


# ---------------------------------------------------------------------------------------------------- the blend
@dataclass
class ServeLog:
    """What the blend used: clips served by the provider, clips decoded in place (with their seconds)."""

    clips: int = 0
    served: list = field(default_factory=list)
    decoded: list = field(default_factory=list)
    decoded_s: list = field(default_factory=list)
    calls: int = 0
    #: clip -> the first tile the provider served of it (A decoded the tiles before it, and stitched)
    partial: dict = field(default_factory=dict)

    @property
    def decoded_compute_s(self) -> float:
        return float(sum(self.decoded_s))


@contextlib.contextmanager
def serve_clips(vae, latents, provider: Callable[[int], object | None], should_cancel: Callable[[], bool] | None = None):
    """While active, ``vae.decode`` of these ``latents`` (diffusers' decode blocks on A) takes clip ``i`` from
    ``provider(i)``, or decodes it with the real ``_decode_clip`` when the provider returns ``None``. Yields a
    :class:`ServeLog`. The caller serialises decodes on this VAE (the override is on the instance)."""
    expected = clip_inputs(vae, latents)
    real = vae._decode_clip
    log = ServeLog(clips=len(expected))

    def served(z):
        i = log.calls
        log.calls += 1
        if i >= len(expected) or z.shape != expected[i].shape or not torch.equal(z, expected[i]):
            raise SplitDecodeError(
                f"diffusers decoded clip {i} from another latent window than comfy-h3 computes "
                f"({tuple(z.shape)} vs {tuple(expected[i].shape) if i < len(expected) else 'no such clip'}): this "
                "diffusers release slices its clips differently; decode on A alone (decode_on 'A')."
            )
        if should_cancel is not None and should_cancel():
            raise DecodeCancelled(f"decode stopped before clip {i + 1}/{len(expected)}: the request was cancelled")
        clip = provider(i)
        if should_cancel is not None and should_cancel():  # it may have been waiting for B's share
            raise DecodeCancelled(f"decode stopped before clip {i + 1}/{len(expected)}: the request was cancelled")
        if clip is not None and not isinstance(clip, Tiles):
            log.served.append(i)
            return clip.to(z.device)
        t0 = time.perf_counter()
        out, served_tiles, waited = (real(z), False, 0.0) if clip is None else _with_tiles(vae, z, clip, real, i)
        _sync(out.device)
        log.decoded.append(i)
        log.decoded_s.append(time.perf_counter() - t0 - waited)  # A's own time: not its wait for B's tiles
        if served_tiles:
            log.partial[i] = clip.first
        return out

    vae._decode_clip = served  # an instance attribute: diffusers' ``self._decode_clip(...)`` finds it first
    try:
        yield log
    finally:
        vae.__dict__.pop("_decode_clip", None)
    if log.calls != len(expected):
        raise SplitDecodeError(f"diffusers decoded {log.calls} clips where comfy-h3 expects {len(expected)}.")


def _with_tiles(vae, z, part: Tiles, real, index: int):
    """Clip ``index`` by the real ``_decode_clip`` (its tiling and stitching, diffusers' code), its decoder decoding
    the tiles before ``part.first`` and then answering the rest from ``part`` (each tile's decoder input checked equal
    to the one the share decoded; all decoded here when ``part`` never came). Returns ``(clip, B's tiles used,
    seconds waited for them)``."""
    expected = tile_inputs(vae, z)
    if not 0 < part.first < len(expected):
        raise SplitDecodeError(f"B's tiles of clip {index} start at tile {part.first}; the clip has {len(expected)}.")
    decoder = vae.decoder
    own = decoder.__dict__.get("forward")  # an offload hook's forward, when one is installed
    forward = own or decoder.forward
    calls, got, waited = [0], [], [0.0]

    def tile_forward(x, *args, **kwargs):
        j = calls[0]
        calls[0] += 1
        if j < part.first:
            return forward(x, *args, **kwargs)
        if not got:
            t0 = time.perf_counter()
            got.append(part.get())  # A's own tiles are done: now B's (waiting for them, bounded, if need be)
            waited[0] = time.perf_counter() - t0
            if got[0] is not None and got[0].shape[0] != len(expected) - part.first:
                raise SplitDecodeError(f"B's tiles of clip {index} (from tile {part.first}, {got[0].shape[0]} of them) "
                                       f"do not fit the clip's {len(expected)} tiles.")
        if got[0] is None:  # B's share was lost: A decodes the clip's other tiles too
            return forward(x, *args, **kwargs)
        want = vae.post_quant_conv(expected[j]) if j < len(expected) else None
        if want is None or x.shape != want.shape or not torch.equal(x, want):
            raise SplitDecodeError(f"diffusers decoded tile {j} of clip {index} from another input than comfy-h3 "
                                   "computes: this diffusers release tiles its clips differently; decode on A alone "
                                   "(decode_on 'A').")
        return got[0][j - part.first: j - part.first + 1].to(x.device)

    decoder.forward = tile_forward
    try:
        out = real(z)
    finally:
        if own is None:
            decoder.__dict__.pop("forward", None)
        else:
            decoder.forward = own
    if calls[0] != len(expected):
        raise SplitDecodeError(f"diffusers decoded {calls[0]} tiles of clip {index} where comfy-h3 expects "
                               f"{len(expected)}.")
    return out, bool(got) and got[0] is not None, waited[0]
