"""Regenerate example_workflows/*.json (ComfyUI UI format 0.4) and their small input media.

The node inputs, outputs and widget order come from the pack's own INPUT_TYPES/RETURN_TYPES, so the files stay in
step with the nodes: run `python scripts/make_example_workflows.py` after changing a node's inputs.

The layout comes from the boxes the real frontend draws each node type in (scripts/node_sizes.json, written by
tests/web/measure_node_sizes.py in frontends 1.49.6 and 1.58.1, classic canvas and Vue nodes; re-measure after
changing a node's widgets or its readout's room): at most four columns of nodes stacked top to bottom, in the order
the work flows where the room allows, with a note saying what to set before the first run at the top of a left
column (the frontend's "errors found" card covers the top right, its minimap the bottom right), and the nodes that
grow after a run (the denoise's and the sampler's preview, the saved video) at the foot of their column, nothing
under them. Each node is saved at its measured size. Opened from the Templates dialog, both frontends ignore the
saved view and fit the nodes to 3/4 of the window (:func:`dialog_view`): the columns are short enough that this
fit is a zoom of at least 0.6 in a 1280 x 720 window (LiteGraph's titles and widgets drawn; tests named core_ui in
tests/test_comfyui_core_ui_templates.py read it on the page). Opened as a file, the saved view opens every template
at a zoom of at least 0.6 with all nodes inside a laptop's first screen, clear of the frontend's sidebar, menus and
minimap (tests/test_example_workflows_view.py and tests/test_web_frontend.py check it).
"""

from __future__ import annotations

import json
import pathlib
import sys
import uuid
import wave

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from comfy_h3_nodes.engine.model.catalog import FROM_MODEL  # noqa: E402
from comfy_h3_nodes.nodes.core_model import H3RemoteModel  # noqa: E402
from comfy_h3_nodes.nodes.loaders import DEFAULT_LORA_PATH, DEFAULT_MODEL_PATH  # noqa: E402
from comfy_h3_nodes.tools.runner import _mappings, input_specs, is_widget  # noqa: E402

OUT = ROOT / "example_workflows"
SIZES = json.loads((ROOT / "scripts" / "node_sizes.json").read_text())
#: ComfyUI's own nodes' slots (inputs in order, outputs), from a ComfyUI's /object_info (scripts/snapshot_core_nodes.py)
CORE = json.loads((ROOT / "scripts" / "core_nodes.json").read_text())
#: The first screen a template must fit in: a 1280 x 720 browser window, in screen pixels. The frontend (1.49 and
#: 1.58) draws over the canvas: its tab bar and the Graph menu / Run bar above FREE_TOP, the sidebar left of
#: FREE_LEFT and the minimap in the corner right of and below MINIMAP (measured in both, classic and Vue nodes).
VIEW_W, VIEW_H = 1280, 720
FREE_LEFT, FREE_TOP, MINIMAP = 60, 80, (1020, 460)
VIEW_MARGIN = 16  # free screen pixels kept between the nodes and whatever the frontend draws
MIN_ZOOM = 0.6  # LiteGraph draws nodes as empty boxes below 8 / 14 = 0.57 (its MinFontSizeForLOD over its text size)
TITLE_H = 30  # the title bar LiteGraph draws above a node's ``pos``
COL_W, GAP_X, GAP_Y = SIZES["width"], 40, 30
#: The Templates dialog's fit (both frontends: LiteGraph's ``fitToBounds`` of the nodes' boxes padded by FIT_PAD, at
#: FIT_ZOOM of the canvas) and the "errors found" card (``data-testid=error-overlay``) the frontends show at the top
#: right when a loader's file is missing, as every h3_core_* template's are on a new machine, in screen pixels:
#: measured at 1280 x 720, 1.49.6 (908, 94)-(1276, 215), 1.58.1 (854, 90)-(1272, 211).
FIT_ZOOM, FIT_PAD = 0.75, 10
ERRORS_CARD = (846, 82, 1280, 219)
#: where the FastH3 template expects FastVideo's FastH3 checkpoint (a diffusers folder with VSA gates)
FASTH3_MODEL_PATH = "/models/FastH3"
#: The note each template opens with, at the top of a left column (clear of the errors card): what to set before the
#: first run, on the canvas rather than behind an error's details.
NOTE_TYPE, NOTE_TITLE, NOTE_SIZE = "MarkdownNote", "Before the first run", [340.0, 200.0]
PROMPT = ("A red fox trots across a snowy meadow at dawn, breath steaming; soft wind, crunching snow and a distant "
          "crow call.")


def node_box(node: dict) -> tuple[float, float, float, float]:
    """A node's canvas rectangle ``(x0, y0, x1, y1)``, its title bar included."""
    (x, y), (w, h) = node["pos"], node["size"]
    return x, y - TITLE_H, x + w, y + h


def saved_view(nodes: list[dict]) -> dict:
    """``extra.ds`` that shows every node on the first screen: LiteGraph draws canvas point ``p`` at screen point
    ``(p + offset) * scale``. The nodes' box starts ``VIEW_MARGIN`` inside the free area's top-left corner, at the
    largest zoom that keeps it inside the screen and every node clear of the minimap's corner."""
    boxes = [node_box(n) for n in nodes]
    x0, y0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
    x1, y1 = max(b[2] for b in boxes), max(b[3] for b in boxes)
    left, top = FREE_LEFT + VIEW_MARGIN, FREE_TOP + VIEW_MARGIN
    fit = min(1.0, (VIEW_W - VIEW_MARGIN - left) / (x1 - x0), (VIEW_H - VIEW_MARGIN - top) / (y1 - y0))
    scale = int(fit * 1000) / 1000  # rounded down: still fits
    corner = (MINIMAP[0] - VIEW_MARGIN, MINIMAP[1] - VIEW_MARGIN)
    while scale >= MIN_ZOOM:
        on_screen = [(left + (b[0] - x0) * scale, top + (b[1] - y0) * scale,
                      left + (b[2] - x0) * scale, top + (b[3] - y0) * scale) for b in boxes]
        if not any(r > corner[0] and btm > corner[1] for _, _, r, btm in on_screen):
            return {"scale": scale, "offset": [round(left / scale - x0, 1), round(top / scale - y0, 1)]}
        scale = round(scale - 0.001, 3)
    raise SystemExit(f"the layout does not fit the first screen at zoom {MIN_ZOOM}: make it smaller")


def size_of(typ: str) -> list[float]:
    """A node's saved size: the largest box the frontends draw it in, without the title bar (a note: at least
    ``NOTE_SIZE``, room for its text without scrolling)."""
    w, h = SIZES["largest"].get(typ, (COL_W, 120 + TITLE_H))
    w, h = max(COL_W, float(w)), float(h) - TITLE_H
    if typ == NOTE_TYPE:
        w, h = max(w, NOTE_SIZE[0]), max(h, NOTE_SIZE[1])
    return [w, h]


def layout(nodes: list[tuple], columns: list[list[int]]) -> dict[int, list[float]]:
    """Positions (``pos``, below the title bar) of node ids placed in columns ``COL_W + GAP_X`` apart, each column's
    nodes one below the other, ``GAP_Y`` apart, from the top."""
    types = {n[0]: n[1] for n in nodes}
    placed = [i for col in columns for i in col]
    assert sorted(placed) == sorted(types), (sorted(placed), sorted(types))
    assert len(columns) <= 4, "more than four columns do not fit the Templates dialog's fit at zoom 0.6"
    pos = {}
    for c, col in enumerate(columns):
        y = 0.0
        for nid in col:
            pos[nid] = [c * (COL_W + GAP_X), y + TITLE_H]
            y += size_of(types[nid])[1] + TITLE_H + GAP_Y
    return pos


def dialog_view(nodes: list[dict]) -> dict:
    """The view a template opens with from the Templates dialog: both frontends ignore ``extra.ds`` there and fit
    the nodes' boxes (padded by ``FIT_PAD``) to ``FIT_ZOOM`` of the canvas, centred (LiteGraph's ``fitToBounds``):
    ``{"scale", "offset"}`` as in ``extra.ds``."""
    boxes = [node_box(n) for n in nodes]
    x0, y0 = min(b[0] for b in boxes) - FIT_PAD, min(b[1] for b in boxes) - FIT_PAD
    w, h = max(b[2] for b in boxes) + FIT_PAD - x0, max(b[3] for b in boxes) + FIT_PAD - y0
    scale = min(FIT_ZOOM * VIEW_W / max(w, 300), FIT_ZOOM * VIEW_H / max(h, 300))
    return {"scale": scale, "offset": [VIEW_W / 2 / scale - x0 - w / 2, VIEW_H / 2 / scale - y0 - h / 2]}


def check_dialog_view(name: str, nodes: list[dict]) -> None:
    """Refuses a layout the Templates dialog would open below ``MIN_ZOOM`` or with its note under the errors card."""
    ds = dialog_view(nodes)
    scale, (ox, oy) = ds["scale"], ds["offset"]
    if scale < MIN_ZOOM:
        raise SystemExit(f"{name}: the Templates dialog opens it at zoom {scale:.3f} (< {MIN_ZOOM}): shorten its columns")
    for n in nodes:
        if n["type"] == NOTE_TYPE:
            x0, y0, x1, y1 = ((v + o) * scale for v, o in zip(node_box(n), (ox, oy, ox, oy)))
            cx0, cy0, cx1, cy1 = ERRORS_CARD
            if x1 > cx0 and x0 < cx1 and y1 > cy0 and y0 < cy1:
                raise SystemExit(f"{name}: the note lies under the errors card at zoom {scale:.3f}: move it left")


def slots(typ: str, core: bool = False) -> tuple[list[dict], list[dict]]:
    """A node type's ``(inputs, outputs)``: the pack's from its INPUT_TYPES / RETURN_TYPES (and the headless runner's
    stand-ins for LoadImage / LoadAudio), with ``core`` ComfyUI's own from the snapshot of its ``/object_info``
    (scripts/core_nodes.json). Each input: name, type (``COMBO`` for a list of
    choices), widget, section, and for an autogrow input the prefix and type of its slots; each output: name, type."""
    if core and typ in CORE["nodes"]:
        spec = CORE["nodes"][typ]
        return [{**i, "type": i["kind"]} for i in spec["inputs"]], spec["outputs"]
    cls = {**_mappings(), "H3RemoteModel": H3RemoteModel}[typ]
    inputs = [{"name": n, "type": "COMBO" if isinstance(t, (list, tuple)) else t, "widget": is_widget(t),
               "section": section} for n, (t, _, section) in input_specs(cls).items()]
    names = getattr(cls, "RETURN_NAMES", None) or cls.RETURN_TYPES
    return inputs, [{"name": n, "type": t} for n, t in zip(names, cls.RETURN_TYPES)]


def input_entry(spec: dict, name: str) -> dict:
    """A node's input slot as the frontend saves it (an autogrow slot ``<input>.<prefix><n>`` is optional: shape 7)."""
    if spec["name"] != name:  # a slot of an autogrow input
        return {"name": name, "label": name.split(".", 1)[1], "localized_name": name.split(".", 1)[1],
                "shape": 7, "type": spec["slot_type"], "link": None}
    entry = {"name": name, "localized_name": name, "type": spec["type"], "link": None}
    if spec["widget"]:
        entry["widget"] = {"name": name}
    return entry


def build(name: str, nodes: list[tuple], columns: list[list[int]], core_graph: bool = False) -> dict:
    """nodes: (id, type, widget values, {input: (src id, src slot)}); columns: the node ids of each column, left to
    right, each top to bottom (see ``layout``).
    The pack's nodes save every input slot (its widgets' too); in a ``core_graph`` ComfyUI's own nodes come from the
    snapshot of its nodes and save their link inputs and those that are linked, as ComfyUI's own templates do."""
    where = layout(nodes, columns)
    types = {n[0]: n[1] for n in nodes}
    links, link_id = [], 0
    out_links: dict[tuple, list] = {}
    node_objs = []
    for nid, typ, widgets, conns in nodes:
        if typ == NOTE_TYPE:  # the frontend's own node: a text, no inputs or outputs, never sent to the server
            node_objs.append({"id": nid, "type": typ, "title": NOTE_TITLE, "pos": where[nid], "size": size_of(typ), "flags": {},
                              "order": 0, "mode": 0, "inputs": [], "outputs": [], "properties": {},
                              "widgets_values": widgets})
            continue
        core = core_graph and typ in CORE["nodes"]
        specs = {i["name"]: i for i in slots(typ, core)[0]}
        wanted = [(n, specs[n]) for n in specs if not (core and specs[n].get("prefix"))]
        wanted += [(c, specs[c.split(".", 1)[0]]) for c in conns if c not in specs]  # autogrow slots in use
        unknown = sorted(c for c in conns if c.split(".", 1)[0] not in specs)
        assert not unknown, f"{name}: {typ} has no input {unknown}"
        inputs = []
        for iname, spec in wanted:
            if core and iname not in conns and (spec["widget"] or spec["section"] == "optional"):
                continue
            if not core and not (iname in conns or spec["widget"] or spec["section"] == "required"):
                continue
            entry = input_entry(spec, iname)
            if iname in conns:
                link_id += 1
                src, slot = conns[iname]
                links.append([link_id, src, slot, nid, len(inputs), slots(types[src], core_graph)[1][slot]["type"]])
                out_links.setdefault((src, slot), []).append(link_id)
                entry["link"] = link_id
            inputs.append(entry)
        props = ({"cnr_id": "comfy-core", "ver": CORE["comfyui_version"]} if core else {"cnr_id": "comfy-h3"})
        if core and typ in CORE_FOLDERS and widgets and widgets[0] in CORE_URLS:
            # the frontend's missing-models dialog offers the file's download (as in ComfyUI's own templates)
            props["models"] = [{"name": widgets[0], "url": CORE_URLS[widgets[0]], "directory": CORE_FOLDERS[typ]}]
        node_objs.append({"id": nid, "type": typ, "pos": where[nid], "size": size_of(typ), "flags": {}, "order": 0,
                          "mode": 0, "inputs": inputs, "outputs": [],
                          "properties": {"Node name for S&R": typ, **props},
                          "widgets_values": widgets})
    for obj in node_objs:
        if obj["type"] == NOTE_TYPE:
            continue
        outputs = slots(obj["type"], core_graph)[1]
        obj["outputs"] = [{"name": o["name"], "localized_name": o["name"], "type": o["type"], "slot_index": i,
                           "links": out_links.get((obj["id"], i), [])} for i, o in enumerate(outputs)]
    for order, obj in enumerate(sorted(node_objs, key=lambda o: (o["pos"][1], o["pos"][0]))):
        obj["order"] = order
    check_dialog_view(name, node_objs)
    return {"id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfy-h3/{name}")), "revision": 0,
            "last_node_id": max(n[0] for n in nodes), "last_link_id": link_id, "nodes": node_objs, "links": links,
            "groups": [], "config": {}, "extra": {"ds": saved_view(node_objs)}, "version": 0.4}


def common(partition: str, width: int, height: int, extra_conns: dict, dit=(2, 0), steps: int = 50,
           denoise_conns: dict | None = None, model: str = DEFAULT_MODEL_PATH) -> list[tuple]:
    return [
        # the part pickers take their parts from model_path (a template may name Comfy-Org's files there instead)
        (1, "H3LoadEncoders", [model, "bfloat16", "sdpa", *[FROM_MODEL] * 3], {}),
        (2, "H3RemoteDiT",
         ["local", "h3_dit", "comfy_h3", model, partition, "bfloat16", "sdpa", "auto", "off"], {}),
        (3, "H3TextEncode", [PROMPT, width, height, 124], {"encoders": (1, 0), **extra_conns}),
        (5, "H3RemoteDenoise", [42, "fixed", steps, 2],
         {"dit": dit, "conditioning": (3, 0), **(denoise_conns or {})}),
        (6, "H3Decode", ["auto"], {"encoders": (1, 0), "latents": (5, 0)}),
        (7, "H3SaveVideo", [24, "h3/video"], {"images": (6, 0), "audio": (6, 1), "fps": (6, 2)}),
    ]


BATCH_PROMPTS = (
    "A red fox trots across a snowy meadow at dawn, breath steaming; soft wind and crunching snow.",
    "A lighthouse on a rocky cape at dusk, waves crashing below; gulls cry over the surf.",
    "A street musician plays a saxophone under a rainy neon sign; rain patters on the pavement.",
    "A hummingbird hovers at a red flower in a sunlit garden; its wings hum, bees buzz nearby.",
)


def note(model: str, lora: bool = False) -> tuple:
    """The template's first-run note: which fields to set, and the tiny random model that needs no weights. What to
    do first is its heading: a note's text is 10 canvas px, 6.1-6.4 px on screen at the 0.61-0.64 the Templates
    dialog opens a template with, and a heading is 20 (15.7 with Vue nodes): 12.3-12.8 px (9.7-10.1). Names and values are bold, not code: the Vue nodes of frontend 1.49 draw
    inline code blue on the note's blue."""
    tiny = "tiny-random-fasth3" if model == FASTH3_MODEL_PATH else "tiny-random"
    fields = "**H3LoadEncoders** and **H3RemoteDiT**" + (" (and **lora_path** on **H3LoRA**)" if lora else "")
    text = (f"# Choose model_path, or {tiny}\n\n"
            f"**model_path** says **{model}**. Choose your model there on {fields}, or choose **{tiny}**"
            f"{' (and **tiny-random** for the LoRA)' if lora else ''} to try the pack without weights: a tiny random "
            f"model each machine builds on first use (its video is noise).\n\n"
            f"**H3RemoteDiT** runs on machine B: **cluster_address** **local** starts B in this ComfyUI; for a second "
            f"Spark see the README's *Machine B (the DiT)*.")
    return (NOTE_ID, NOTE_TYPE, [text], {})


NOTE_ID = 20


#: Comfy-Org's file names, as ComfyUI's own video_minimax_h3_* templates load them (the DiT's on machine B)
CORE_FILES = {"clip": "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors", "vae": "minimax_h3_video_vae_fp16.safetensors",
              "audio_vae": "minimax_h3_audio_vae_fp32.safetensors",
              "dit": "minimax_h3_fl2va_pruned_int8_convrot.safetensors",
              "dit_ref": "minimax_h3_ref2va_pruned_int8_convrot.safetensors"}
#: where Comfy-Org publishes A's files (ComfyUI's own templates name the same), and the folder each loader reads
CORE_URLS = {CORE_FILES[k]: f"https://huggingface.co/Comfy-Org/MiniMax-H3/resolve/main/{d}/{CORE_FILES[k]}"
             for k, d in (("clip", "text_encoders"), ("vae", "vae"), ("audio_vae", "vae"))}
CORE_FOLDERS = {"CLIPLoader": "text_encoders", "VAELoader": "vae"}
#: the sampling of ComfyUI's own H3 templates (their turbo switch off): res_multistep, simple, 20 steps
CORE_SAMPLER, CORE_SCHEDULER, CORE_STEPS = "res_multistep", "simple", 20
CORE_NOTE_ID = 20


def core_graph(workflow: str) -> tuple[list[tuple], list[list[int]]]:
    """ComfyUI's own H3 graph (the nodes of its video_minimax_h3_* templates, flat: no subgraph), its UNETLoader
    swapped for H3RemoteModel, and the columns: the note above A's loaders (text encoder, VAEs) and the sampler's
    choice; the input image, the encode (and the noise where there is room); the remote model above the schedule and
    the guider it feeds and the sampler, whose preview grows; the decodes, the video and its save, which grows."""
    ref = workflow == "r2va"
    encode = "MiniMaxH3ReferenceToVideo" if ref else "MiniMaxH3ImageToVideo"
    conns = {"clip": (1, 0), "vae": (2, 0)}
    widgets = [PROMPT, 832, 480, 124]
    if ref:
        conns.update({"audio_vae": (3, 0), "ref_images.ref_image_0": (8, 0)})
        widgets.append("match")
    elif workflow == "i2va":
        conns["first_frame"] = (8, 0)
    nodes = [
        (1, "CLIPLoader", [CORE_FILES["clip"], "minimax", "default"], {}),
        (2, "VAELoader", [CORE_FILES["vae"]], {}),
        (3, "VAELoader", [CORE_FILES["audio_vae"]], {}),
        (4, "H3RemoteModel", [CORE_FILES["dit_ref" if ref else "dit"], "bfloat16", "auto", "local", "off",
                              "h3_dit*", "comfy_h3"], {}),
        (5, encode, widgets, conns),
        (6, "RandomNoise", [42, "fixed"], {}),
        (7, "KSamplerSelect", [CORE_SAMPLER], {}),
        (9, "BasicScheduler", [CORE_SCHEDULER, CORE_STEPS, 1.0], {"model": (4, 0)}),
        (10, "BasicGuider", [], {"model": (4, 0), "conditioning": (5, 0)}),
        (11, "SamplerCustomAdvanced", [], {"noise": (6, 0), "guider": (10, 0), "sampler": (7, 0), "sigmas": (9, 0),
                                           "latent_image": (5, 1)}),
        (12, "VAEDecode", [], {"samples": (11, 0), "vae": (2, 0)}),
        (13, "VAEDecodeAudio", [], {"samples": (11, 0), "vae": (3, 0)}),
        (14, "CreateVideo", [24.0, 8], {"images": (12, 0), "audio": (13, 0)}),
        (15, "SaveVideo", [f"video/h3_core_{workflow}", "auto", "auto"], {"video": (14, 0)}),
        core_note(workflow),
    ]
    columns = [[CORE_NOTE_ID, 1, 2, 3, 7], [5, 6], [4, 9, 10, 11], [12, 13, 14, 15]]
    if workflow != "t2va":
        nodes.append((8, "LoadImage", ["h3_reference.png" if ref else "h3_first.png", "image"], {}))
        columns[1].insert(0, 8)
    if ref:  # the reference encode is taller: the noise goes above the decodes
        columns[1].remove(6)
        columns[3].insert(0, 6)
    return nodes, columns


def core_note(workflow: str) -> tuple:
    """The first-run note of a core template: which files to choose on which machine, and what runs where."""
    dit = CORE_FILES["dit_ref" if workflow == "r2va" else "dit"]
    text = ("# Choose each loader's file\n\n"
            "**ComfyUI's own H3 graph with the DiT on machine B.** Choose A's files on **CLIPLoader** and the two "
            "**VAELoader**s (ComfyUI's text_encoders and vae folders), and B's transformer on **H3RemoteModel** "
            f"(shipped: **{dit}**).\n\n**cluster_address** **local** starts B in this ComfyUI; for a second Spark see "
            "the README's *Machine B (the DiT)*. The sampler runs here; each of its forwards runs on B.")
    return (CORE_NOTE_ID, NOTE_TYPE, [text], {})


def write_media() -> None:
    from PIL import Image

    ins = OUT / "inputs"
    ins.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:96, 0:160]
    first = np.stack([xx * 255 // 159, yy * 255 // 95, np.full_like(xx, 90)], -1).astype(np.uint8)
    last = first[:, ::-1, [2, 0, 1]].copy()
    Image.fromarray(first).save(ins / "h3_first.png")
    Image.fromarray(last).save(ins / "h3_last.png")
    ref = np.stack([(xx + yy) % 256, (xx * 2) % 256, (yy * 3) % 256], -1).astype(np.uint8)
    Image.fromarray(ref).save(ins / "h3_reference.png")
    for rate, fname in ((32000, "h3_voice_32k.wav"), (160, "h3_voice_160hz.wav")):
        t = np.arange(int(rate * 1.0)) / rate
        tone = 0.3 * np.sin(2 * np.pi * min(440.0, rate / 8) * t)
        pcm = (np.stack([tone, tone * 0.8], 1) * 32767).astype("<i2")
        with wave.open(str(ins / fname), "wb") as w:
            w.setnchannels(2)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes(pcm.tobytes())


def main() -> None:
    write_media()
    # name: (nodes, columns): the note (NOTE_ID) above the DiT, the encoders above the encode, the denoise, the decode
    # above the save; with inputs (fl2va, ref2va) the inputs first, the note above the encoders, the encode above
    # the decode and the save, B's DiT above its denoise
    t2va = [[NOTE_ID, 2], [1, 3], [5], [6, 7]]
    flows = {
        "h3_t2va": (common("transformer", 832, 480, {}), t2va),
        # FastH3 v1: 5 sigma points (4 forwards), the schedule its checkpoint was trained for; B runs VSA-H3
        "h3_fasth3_t2va": (common("transformer", 832, 480, {}, steps=5, model=FASTH3_MODEL_PATH), t2va),
        "h3_t2va_turbo": (common("transformer", 832, 480, {}, dit=(11, 0), steps=4) + [
            (11, "H3LoRA", [DEFAULT_LORA_PATH, 1.0], {"dit": (2, 0)}),
        ], [[NOTE_ID, 2], [1, 3], [11, 5], [6, 7]]),
        "h3_fl2va": (common("transformer", 832, 480, {"keyframes": (4, 0)}) + [
            (8, "LoadImage", ["h3_first.png", "image"], {}),
            (9, "LoadImage", ["h3_last.png", "image"], {}),
            (4, "H3Keyframes", [], {"first_image": (8, 0), "last_image": (9, 0)}),
        ], [[8, 9], [NOTE_ID, 3, 6], [2, 5], [1, 4, 7]]),  # the save in a shorter column: room for its video
        "h3_t2va_batch": (common("transformer", 832, 480, {"prompt": (12, 0)}, denoise_conns={"seed": (12, 1)}) + [
            (12, "H3PromptList", ["\n".join(BATCH_PROMPTS), 42, "fixed", "increment"], {}),
        ], [[NOTE_ID, 2], [1, 12], [3, 5], [6, 7]]),
        "h3_ref2va": (common("transformer_ref", 832, 480, {"references": (4, 0)}) + [
            (8, "LoadImage", ["h3_reference.png", "image"], {}),
            (10, "LoadAudio", ["h3_voice_32k.wav"], {}),
            (4, "H3References", [], {"images": (8, 0), "audio": (10, 0)}),
        ], [[NOTE_ID, 8, 10], [4, 3, 6], [1, 5], [2, 7]]),  # the denoise and the save in short columns: room to grow
    }
    for name, (nodes, columns) in flows.items():
        model = next(n[2][0] for n in nodes if n[1] == "H3LoadEncoders")
        nodes = nodes + [note(model, lora=any(n[1] == "H3LoRA" for n in nodes))]
        (OUT / f"{name}.json").write_text(json.dumps(build(name, nodes, columns), indent=1) + "\n")
        print("wrote", OUT / f"{name}.json")
    for workflow in ("t2va", "i2va", "r2va"):  # ComfyUI's own nodes, the DiT on B: H3RemoteModel for UNETLoader
        name = f"h3_core_{workflow}"
        (OUT / f"{name}.json").write_text(json.dumps(build(name, *core_graph(workflow), core_graph=True),
                                                     indent=1) + "\n")
        print("wrote", OUT / f"{name}.json")


if __name__ == "__main__":
    main()
