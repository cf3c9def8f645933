"""The node pack: imports without ComfyUI, example workflows through the runner on the two-node cluster, MP4s,
timing records per node, interrupt, workflow checks and the HTTP routes."""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import subprocess
import sys

import av
import numpy as np
import pytest

from comfy_h3_nodes.tools import runner
from comfy_h3_nodes.engine import session
from comfy_h3_nodes.nodes import NODE_CLASS_MAPPINGS
from conftest import PROMPT

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: the templates of the pack's own nodes (the h3_core_* ones are ComfyUI's own graph: tests/test_core_templates.py)
EXAMPLES = sorted(p for p in (ROOT / "example_workflows").glob("h3_*.json") if not p.stem.startswith("h3_core_"))
SINGLE = [p for p in EXAMPLES if p.stem != "h3_t2va_batch"]  # the batch example has tests of its own (test_batch)
TINY_SETTINGS = ["3.width=64", "3.height=64", "3.num_frames=124", "5.steps=3", "1.dtype=\"float32\"",
                 "2.dtype=\"float32\"", "2.actor_name=\"new:h3_dit_test\""]  # its own worker, asked for in so many words
#: the FastH3 template: its checkpoint's folder and tiny model, and its trained steps (5 sigma points) as shipped
FASTH3 = {"default": "/models/FastH3", "tiny": "tiny-random-fasth3", "forwards": 4, "actor": "h3_dit_fasth3_nodes"}


def _forwards(name: str) -> int:
    return {"h3_t2va_turbo": 3, "h3_fasth3_t2va": FASTH3["forwards"]}.get(name, 2)  # steps 4, 5 or 3 sigma points


def test_pack_imports_without_comfyui_ray_or_diffusers():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('comfy_h3_pack', r'{ROOT / '__init__.py'}',"
        f" submodule_search_locations=[r'{ROOT}'])\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['comfy_h3_pack'] = m; spec.loader.exec_module(m)\n"
        "heavy = [x for x in ('ray', 'diffusers', 'transformers', 'torch', 'comfy', 'server') if x in sys.modules]\n"
        "print(sorted(m.NODE_CLASS_MAPPINGS), m.WEB_DIRECTORY, heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    names, web, heavy = out.stdout.strip().rsplit(" ", 2)[0], None, None
    assert "'H3RemoteDenoise'" in out.stdout and "./web" in out.stdout
    assert out.stdout.strip().endswith("[]"), f"heavy modules imported at pack import: {out.stdout}"
    assert set(NODE_CLASS_MAPPINGS) == {"H3LoadEncoders", "H3RemoteDiT", "H3LoRA", "H3Keyframes", "H3References",
                                        "H3PromptList", "H3TextEncode", "H3RemoteDenoise", "H3Decode",
                                        "H3SaveVideo"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_workflow_matches_input_types(path):
    wf = json.loads(path.read_text())
    assert wf["version"] == 0.4
    mappings = runner._mappings()
    nodes = {n["id"]: n for n in wf["nodes"]}
    for link in wf["links"]:
        lid, src, slot, dst, dst_slot, typ = link
        assert mappings[nodes[src]["type"]].RETURN_TYPES[slot] == typ
        target_input = nodes[dst]["inputs"][dst_slot]
        assert target_input["link"] == lid and target_input["type"] == typ
        spec = runner.input_specs(mappings[nodes[dst]["type"]])[target_input["name"]]
        assert spec[0] == typ
    for node in wf["nodes"]:
        if node["type"] in runner.UI_ONLY_TYPES:  # the first-run note: the frontend's, never sent
            assert not node["inputs"] and not node["outputs"]
            continue
        cls = mappings[node["type"]]
        names = runner.widget_names(cls)
        extra = sum(1 for n in names if runner.input_specs(cls)[n][1].get("control_after_generate"))
        if node["type"] in ("LoadImage",):
            extra += 1  # the upload widget
        assert len(node["widgets_values"]) == len(names) + extra, node["type"]
        assert {i["name"] for i in node["inputs"]} >= set(names)
    api = runner.ui_to_api(wf)
    fasth3 = path.stem == "h3_fasth3_t2va"
    real = FASTH3["default"] if fasth3 else "/models/MiniMax-H3"
    assert api["1"]["inputs"]["model_path"] == api["2"]["inputs"]["model_path"] == real  # real default
    with pytest.raises(runner.WorkflowError, match="choose 'tiny-random'"):
        runner.check_prompt(api)  # without the weights: one sentence that shows the way to try it anyway
    runner.apply_overrides(api, FASTH3["tiny"] if fasth3 else runner.TINY, [])
    order = runner.check_prompt(api)
    assert order.index("3") < order.index("5") < order.index("6") < order.index("7")


@pytest.fixture(scope="module")
def runs(local_host, tiny_ckpt, tiny_fasth3, tmp_path_factory):
    """Each example workflow, once, through the runner (shared by the assertions below)."""
    out = {}
    blocked = pytest.MonkeyPatch()
    blocked.setitem(sys.modules, "torchaudio", None)  # ref2va's 32 kHz voice is resampled with PyAV: no torchaudio
    for path in SINGLE:
        sets, model = list(TINY_SETTINGS), tiny_ckpt
        if path.stem == "h3_fasth3_t2va":  # B serves the tiny FastH3 checkpoint at the template's own 5 steps
            sets = [s for s in sets if not s.startswith(("5.steps=", "2.actor_name="))]
            sets.append(f"2.actor_name={json.dumps('new:' + FASTH3['actor'])}")  # its own B: the session's serves tiny-random
            model = tiny_fasth3
        if path.stem == "h3_t2va_turbo":
            from comfy_h3_nodes.engine.model.tiny import build_tiny_lora

            lora = build_tiny_lora(tmp_path_factory.mktemp("lora") / "turbo4.safetensors", seed=3, steps=4, shift=5.0)
            sets += [f"11.lora_path={json.dumps(str(lora))}", "5.steps=4"]
        folder = tmp_path_factory.mktemp(path.stem)
        events = folder / "events.jsonl"
        res = runner.execute(str(path), model_path=str(model), sets=sets, output=str(folder),
                             events_out=str(events), quiet=True)
        out[path.stem] = (res, events)
    blocked.undo()
    yield out
    import ray

    try:
        ray.kill(ray.get_actor(FASTH3["actor"], namespace="comfy_h3"), no_restart=True)  # the FastH3 run's own B
    except ValueError:
        pass


@pytest.mark.parametrize("name", [p.stem for p in SINGLE])
def test_example_workflow_writes_mp4(runs, name):
    res, _ = runs[name]
    (video,) = res.videos()
    with av.open(str(video)) as c:
        vs = c.streams.video[0]
        assert vs.codec_context.name == "h264" and vs.average_rate == 24
        assert sum(1 for _ in c.decode(video=0)) == 124
        assert c.streams.audio[0].codec_context.name == "aac"
        wf = json.loads(c.metadata["workflow"])
        assert wf["nodes"] and any(n["type"] == "H3RemoteDenoise" for n in wf["nodes"])
        assert "H3TextEncode" in c.metadata["prompt"]


@pytest.mark.parametrize("name", [p.stem for p in SINGLE])
def test_every_h3_node_reports_timing(runs, name):
    res, events = runs[name]
    h3_nodes = {nid for nid, n in runner.ui_to_api(json.loads((ROOT / "example_workflows" / f"{name}.json")
                                                                .read_text())).items()
                if n["class_type"].startswith("H3")}
    payloads = res.timing_payloads()
    assert set(payloads) == h3_nodes
    for nid in h3_nodes:
        assert res.ui[nid]["h3_timing"][0] == payloads[nid]
        assert payloads[nid]["stages"] and payloads[nid]["summary"]["compute_s"] >= 0
    den = next(p for p in payloads.values() if p["node_type"] == "H3RemoteDenoise")
    assert [s["stage"] for s in den["stages"]] == ["a_to_b", "denoise", "b_to_a"]
    assert den["summary"]["a_to_b"]["bytes"] > 0 and den["summary"]["b_to_a"]["fetch_s"] > 0
    forwards = _forwards(name)
    assert den["summary"]["steps_done"] == forwards
    recorded = [json.loads(line) for line in events.read_text().splitlines()]
    progress = [e for e in recorded if e["type"] == "h3.progress"]
    assert [e["data"]["step"] for e in progress] == list(range(1, forwards + 1))
    if name == "h3_t2va_turbo":
        assert "shift 5 (video)" in den["summary"]["schedule"] and "turbo4.safetensors" in den["summary"]["schedule"]
    if name == "h3_fasth3_t2va":
        assert "VSA-H3 (FastH3 v1" in den["summary"]["schedule"] and "kernel torch" in den["summary"]["schedule"]
    assert session.TIMINGS.records(den["request_id"])


def test_node_frames_equal_engine_frames(local_host, executor, tiny_ckpt, media):
    import comfy_h3_nodes.nodes as N
    from comfy_h3_nodes.engine.contract.request import H3Request

    encoders = N.H3LoadEncoders().load(str(tiny_ckpt), "float32", "sdpa", unique_id="1")["result"][0]
    dit = N.H3RemoteDiT().connect("local", executor.b_config.name, executor.b_config.namespace, str(tiny_ckpt),
                                  "transformer", "float32", "sdpa", unique_id="2")["result"][0]
    cond = N.H3TextEncode().encode(encoders, PROMPT, 64, 64, 124, unique_id="3")["result"][0]
    lat = asyncio.run(N.H3RemoteDenoise().denoise(dit, cond, 7, 3, unique_id="5"))["result"][0]
    (images,), (audio,), (fps,) = N.H3Decode().decode(encoders, lat, unique_id="6")["result"]  # lists: OUTPUT_IS_LIST
    ref = executor.generate(H3Request(prompt=PROMPT, height=64, width=64, num_frames=124, steps=3, seed=7))
    assert np.array_equal(images.numpy(), ref.media.frames)
    assert np.array_equal(audio["waveform"][0].numpy(), ref.media.audio) and fps == 24


def test_interrupt_during_denoise_stops_b_and_next_run_works(local_host, executor, tiny_ckpt):
    import ray

    import comfy_h3_nodes.nodes as N
    from comfy_h3_nodes.engine.contract.errors import H3Cancelled

    encoders = N.H3LoadEncoders().load(str(tiny_ckpt), "float32", "sdpa")["result"][0]
    dit = N.H3RemoteDiT().connect("local", executor.b_config.name, executor.b_config.namespace, str(tiny_ckpt),
                                  "transformer", "float32", "sdpa")["result"][0]
    cond = N.H3TextEncode().encode(encoders, PROMPT, 64, 64, 124)["result"][0]

    def listener(event, data):
        if event == "h3.progress" and data["step"] == 3:
            local_host.interrupt_flag.set()

    local_host.listeners.append(listener)
    try:
        with pytest.raises(H3Cancelled, match="interrupted"):
            asyncio.run(N.H3RemoteDenoise().denoise(dit, cond, 1, 200, unique_id="5"))
    finally:
        local_host.listeners.remove(listener)
        local_host.interrupt_flag.clear()
    rid = [d for e, d in local_host.events if e == "h3.progress"][-1]["request_id"]
    prog = ray.get(dit.b.progress.remote(rid), timeout=10)
    assert prog["state"] == "cancelled" and len(prog["steps"]) - prog["cancel_at_step"] <= 1
    (ok,) = asyncio.run(N.H3RemoteDenoise().denoise(dit, cond, 2, 3))["result"][0]
    assert ok.latents().latents.shape == (1, 24, 37, 4, 4)


def _tiny_api() -> dict:
    api, _ = runner.load_workflow(EXAMPLES[0])
    runner.apply_overrides(api, runner.TINY, [])
    return api


def test_runner_rejects_unknown_nodes_and_missing_links(tmp_path):
    wf = json.loads(EXAMPLES[0].read_text())
    wf["nodes"].append({"id": 99, "type": "KSamplerAdvanced", "inputs": [], "outputs": [], "widgets_values": []})
    bad = tmp_path / "unknown.json"
    bad.write_text(json.dumps(wf))
    with pytest.raises(runner.WorkflowError, match="KSamplerAdvanced"):
        runner.load_workflow(bad)
    api = _tiny_api()
    del api["5"]["inputs"]["conditioning"]
    with pytest.raises(runner.WorkflowError, match=r"node 5 \(H3RemoteDenoise\) is missing input 'conditioning'"):
        runner.check_prompt(api)
    api = _tiny_api()
    api["3"]["inputs"]["width"] = 500
    with pytest.raises(runner.WorkflowError, match="width 500 is not a multiple of 32; nearest valid: 480 or 512"):
        runner.check_prompt(api)
    api = _tiny_api()
    api["6"]["inputs"]["latents"] = ["3", 0]
    with pytest.raises(runner.WorkflowError, match="expects H3_LATENTS but is linked to a H3_CONDITIONING"):
        runner.check_prompt(api)


def test_cli_run_reports_bad_workflow_clearly(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    out = subprocess.run([sys.executable, "-m", "comfy_h3_nodes", "run", str(bad)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "is not valid JSON" in out.stderr


def test_validate_inputs_messages():
    from comfy_h3_nodes.engine.contract.request import RequestError, check_cluster_address
    from comfy_h3_nodes.nodes import H3LoRA, H3RemoteDenoise, H3RemoteDiT, H3TextEncode

    assert H3TextEncode.VALIDATE_INPUTS(width=832, height=480) is True
    assert "nearest valid: 832 or 864" in H3TextEncode.VALIDATE_INPUTS(width=840, height=480)
    assert "nearest valid: 1" in H3RemoteDenoise.VALIDATE_INPUTS(steps=0)
    assert "-10..10" not in str(H3LoRA.VALIDATE_INPUTS(lora_path="/b/x.safetensors"))
    assert "not a .safetensors" in H3LoRA.VALIDATE_INPUTS(lora_path="/b/x.bin")
    assert H3LoRA.VALIDATE_INPUTS(lora_path="tiny-random") is True
    assert "tiny-random" in H3RemoteDiT.VALIDATE_INPUTS(model_path=" ")
    with pytest.raises(RequestError, match="host:port"):
        check_cluster_address("nowhere")
    assert check_cluster_address(" 10.0.0.1:6379 ") == "10.0.0.1:6379" and check_cluster_address("local") == "local"


# (width, height) -> the input the message is about (None: about both) and words it must hold
CANVAS_MESSAGES = [
    ((832, 0), "height", "height 0 means an automatic canvas, which needs width 0 too"),
    ((0, 480), "width", "width 0 means an automatic canvas, which needs height 0 too"),
    ((100, 480), "width", "width 100 is not a multiple of 32; nearest valid: 96 or 128"),
    ((832, 500), "height", "height 500 is not a multiple of 32; nearest valid: 480 or 512"),
    ((832, 16), "height", "height 16 is too small"),
    ((1280, 160), None, "canvas 1280x160 has aspect ratio 8"),
]


@pytest.mark.parametrize("size,about,words", CANVAS_MESSAGES, ids=lambda v: str(v))
def test_canvas_message_is_one_sentence_about_the_input_it_concerns(size, about, words):
    """ComfyUI attaches the message to both width and height (the check names both): a message about one of them
    starts with that input, says it is about that one only and that ComfyUI lists it under the other too; the
    headless runner, which can target an input, names that input instead."""
    from comfy_h3_nodes.nodes import H3TextEncode

    width, height = size
    msg = H3TextEncode.VALIDATE_INPUTS(width=[width], height=[height])
    assert isinstance(msg, str) and msg.startswith(words), msg
    assert msg.about == about and msg.sentence.startswith(words)
    other = {"width": "height", "height": "width"}.get(about)
    if about:
        assert msg.count(f"{about} ") >= 1 and not msg.startswith(other), msg
        assert f"About {about} only: ComfyUI lists a node's own check under every input the check reads, so {other} " \
               "shows it too." in msg, msg
    else:
        assert msg == msg.sentence and "About" not in msg  # about both: shown on both is where it belongs
    api = _tiny_api()
    api["3"]["inputs"].update(width=width, height=height)
    where = rf"node 3 \(H3TextEncode\) input '{about}': " if about else r"node 3 \(H3TextEncode\): "
    with pytest.raises(runner.WorkflowError, match=where + re.escape(words)) as err:
        runner.check_prompt(api)
    assert "ComfyUI lists" not in str(err.value)


# ComfyUI shows a VALIDATE_INPUTS message on every input the method names (one error per named input): so each names
# only the inputs its messages are about. Ranges ComfyUI checks itself (seed, strength, num_frames) stay unnamed.
VALIDATED = {"H3LoadEncoders": {"model_path"}, "H3RemoteDiT": {"model_path"}, "H3LoRA": {"lora_path"},
             "H3TextEncode": {"width", "height"}, "H3RemoteDenoise": {"steps"}}


@pytest.mark.parametrize("name", sorted(VALIDATED))
def test_validate_inputs_name_only_the_inputs_their_messages_are_about(name):
    import inspect

    cls = NODE_CLASS_MAPPINGS[name]
    assert set(inspect.signature(cls.VALIDATE_INPUTS).parameters) == VALIDATED[name]
    specs = runner.input_specs(cls)
    for unnamed in ("seed", "strength", "num_frames"):
        if unnamed in specs:
            opts = specs[unnamed][1]
            assert "min" in opts and "max" in opts  # ComfyUI's own range check covers it


def test_bad_value_of_an_unnamed_input_is_caught_by_the_range_check():
    api = _tiny_api()
    api["3"]["inputs"]["num_frames"] = 400
    with pytest.raises(runner.WorkflowError, match=r"'num_frames' is 400; it must be within 124..345"):
        runner.check_prompt(api)
    api["3"]["inputs"]["num_frames"] = 124
    api["5"]["inputs"]["steps"] = 0  # named by VALIDATE_INPUTS: our own sentence
    with pytest.raises(runner.WorkflowError, match="nearest valid: 1"):
        runner.check_prompt(api)


def test_status_and_timings_routes(local_host, executor, runs):
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from comfy_h3_nodes.host.routes import add_routes

    async def go():
        app = web.Application()
        add_routes(app)
        async with TestClient(TestServer(app)) as client:
            st = await (await client.get("/h3/status")).json()
            tj = await (await client.get("/h3/timings")).json()
            csv_resp = await client.get("/h3/timings?format=csv")
            return st, tj, csv_resp.headers["Content-Type"], await csv_resp.text()

    st, tj, ctype, csv_text = asyncio.run(go())
    assert st["connected"] and st["topology"]["B"]["ip"] == "127.0.0.3" and st["error"] is None
    assert any(a["health"]["B"]["node_ip"] == "127.0.0.3" for a in st["actors"] if "health" in a)
    assert st["encoders"] and all(e["memory_plan"].startswith("A plan (") for e in st["encoders"])  # A's plan too
    stages = {r["stage"] for r in tj["records"]}
    assert {"encode", "a_to_b", "denoise", "b_to_a", "decode", "save"} <= stages
    assert ctype.startswith("text/csv") and csv_text.splitlines()[0].startswith("request_id,stage,machine")


def test_remote_dit_node_recovers_when_its_b_actor_is_gone(local_host, tiny_ckpt):
    """H3RemoteDiT re-checks health on every run; a B actor that vanished is found or recreated, no restart."""
    import ray

    import comfy_h3_nodes.nodes as N

    args = ("local", "new:h3_dit_reconnect", "comfy_h3", str(tiny_ckpt), "transformer", "float32", "sdpa")
    first = N.H3RemoteDiT().connect(*args)["result"][0]
    pid = ray.get(first.b.health.remote(), timeout=10)["pid"]
    ray.kill(first.b, no_restart=True)
    out = N.H3RemoteDiT().connect(*args)
    second = out["result"][0]
    assert second is not first
    new_pid = ray.get(second.b.health.remote(), timeout=30)["pid"]
    assert new_pid != pid
    # the readout says B's model was loaded again, by which process (#39: B brought back by its service)
    said = f"B's model was loaded again by its new worker process (pid {pid} -> {new_pid}, "
    assert second.b_reload_note.startswith(said), second.b_reload_note
    assert said in json.dumps(out["ui"]), out["ui"]
    encoders = N.H3LoadEncoders().load(str(tiny_ckpt), "float32", "sdpa")["result"][0]
    cond = N.H3TextEncode().encode(encoders, PROMPT, 64, 64, 124)["result"][0]
    (lat,) = asyncio.run(N.H3RemoteDenoise().denoise(second, cond, 3, 3))["result"][0]
    assert lat.latents().latents.shape == (1, 24, 37, 4, 4)
    ray.kill(second.b, no_restart=True)


def test_remote_dit_refuses_a_model_b_lacks_before_starting_a_worker(local_host, tiny_ckpt, tmp_path):
    """The shipped templates' /models/MiniMax-H3 on a machine without it: H3RemoteDiT (the node that owns the
    setting) fails with the way out, before any DiT worker process loads torch; a folder without the partition too."""
    import ray

    import comfy_h3_nodes.nodes as N
    from comfy_h3_nodes.engine.contract.errors import ModelFolderError

    args = ("local", "new:h3_dit_nomodel", "comfy_h3")
    with pytest.raises(ModelFolderError) as info:
        N.H3RemoteDiT().connect(*args, str(tmp_path / "MiniMax-H3"), "transformer", "float32", "sdpa")
    msg = str(info.value)
    assert msg == (f"model path {tmp_path / 'MiniMax-H3'} does not exist on machine B; choose a model B has in "
                   "H3RemoteDiT's model_path, or 'tiny-random' to try the pack without weights.")
    import shutil

    partial = tmp_path / "partial"
    shutil.copytree(tiny_ckpt, partial, ignore=shutil.ignore_patterns("transformer"))
    with pytest.raises(ModelFolderError, match=r"lacks the component 'transformer'.*on machine B.*'tiny-random'"):
        N.H3RemoteDiT().connect(*args, str(partial), "transformer", "float32", "sdpa")
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("h3_dit_nomodel")]


def test_remote_dit_names_the_missing_model_when_b_runs_another(local_host, tiny_ckpt, tmp_path):
    """A running worker asked for a model B lacks keeps serving its own, and the node says both."""
    import comfy_h3_nodes.nodes as N
    from comfy_h3_nodes.engine.contract.errors import ModelFolderError

    args = ("local", "new:h3_dit_switch", "comfy_h3")
    dit = N.H3RemoteDiT().connect(*args, str(tiny_ckpt), "transformer", "float32", "sdpa")["result"][0]
    with pytest.raises(ModelFolderError) as info:
        N.H3RemoteDiT().connect(*args, str(tmp_path / "gone"), "transformer", "float32", "sdpa")
    assert str(info.value) == (f"model path {tmp_path / 'gone'} does not exist on machine B; choose a model B has in "
                               "H3RemoteDiT's model_path, or 'tiny-random' to try the pack without weights (B serves "
                               f"{tiny_ckpt} now and keeps serving it).")
    import ray

    assert ray.get(dit.b.health.remote(), timeout=30)["ok"]
    ray.kill(dit.b, no_restart=True)


def test_remote_dit_refuses_an_actor_name_typo_in_the_embedded_cluster(local_host, tiny_ckpt):
    """#37 item 5 in the embedded cluster (this process would start B's worker itself): a name that matches no worker
    while B holds one is refused with the names B has and the way to ask for another in so many words; no second
    worker is started and the resident one keeps serving; ``new:<name>`` starts it on purpose."""
    import ray

    import comfy_h3_nodes.nodes as N

    rest = (str(tiny_ckpt), "transformer", "float32", "sdpa")
    held = N.H3RemoteDiT().connect("local", "new:h3_dit_held", "comfy_h3", *rest)["result"][0]
    try:
        with pytest.raises(Exception) as info:
            N.H3RemoteDiT().connect("local", "h3_dit_hedl", "comfy_h3", *rest)
        msg = str(info.value)
        assert msg.startswith("actor_name 'h3_dit_hedl' names no DiT worker in namespace 'comfy_h3', and B already "
                              "holds "), msg
        assert "h3_dit_held" in msg and "'new:h3_dit_hedl' to start another worker on purpose" in msg, msg
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
        assert "h3_dit_hedl" not in names and "h3_dit_held" in names, names
        assert ray.get(held.b.health.remote(), timeout=30)["ok"]
        again = N.H3RemoteDiT().connect("local", "new:h3_dit_hedl", "comfy_h3", *rest)["result"][0]
        assert ray.get(again.b.health.remote(), timeout=60)["ok"]  # asked for in so many words: started
        ray.kill(again.b, no_restart=True)
    finally:
        ray.kill(held.b, no_restart=True)
