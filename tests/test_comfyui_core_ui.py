"""ComfyUI's own H3 graphs with the DiT on B as users meet them (issue #37): two machines with B's model root a
ComfyUI ``models/`` tree, names as ComfyUI's pickers give them, typos refused in one sentence on the node they came
from. Through the real ComfyUI, with the fixtures and helpers of ``tests/test_comfyui_integration.py`` (imported: the
same server set-up, the same skip without ``COMFYUI_DIR``); ``make test-comfyui K='core_ui'`` runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import re
import shutil
import time

import pytest

from comfy_h3_nodes.engine.model.tiny_comfy import fixture
from test_comfyui_integration import (  # noqa: F401 - fixtures are found by name in this module
    CORE_LORAS, FRONTENDS, JS_ENTER_UNETLOADER, JS_TITLE_POINT, MISSING_MODELS_SETTING, MODES, NATIVE_DIT,
    NATIVE_REF_DIT, QUEUE_LIKE_A_USER, TAB_BUTTON, VUE_SETTING, ComfyPage, _core_model_prompt, _http_json, _of, _ok, _queue_and_wait, _run,
    _started_comfyui, _status, browser, comfyui, comfyui_frontends, pytestmark, two_machine_layout,
)
from browser_support import overlaps

#: a transformer file only B has, under B's ComfyUI models/ tree (A's ComfyUI has no such file)
B_ONLY = "minimax_h3_t2va_on_b_only.safetensors"


def _b_models_tree(root: pathlib.Path, tiny_ckpt) -> pathlib.Path:
    """B's model root as a ComfyUI ``models/`` tree: ``diffusion_models/`` with the tiny Comfy-Org t2va and ref2va
    files (their tiny configs beside them, as ComfyUI's folder holds Comfy-Org's) and :data:`B_ONLY`."""
    dm = root / "diffusion_models"
    dm.mkdir(parents=True)
    shutil.copy(fixture(tiny_ckpt, "transformer:pruned_bf16"), dm / NATIVE_DIT)
    shutil.copy(fixture(tiny_ckpt, "transformer:pruned_bf16"), dm / B_ONLY)
    shutil.copy(fixture(tiny_ckpt, "transformer_ref:pruned_bf16"), dm / NATIVE_REF_DIT)
    for part in ("transformer", "transformer_ref"):
        shutil.copytree(tiny_ckpt / "comfy" / "diffusion_models" / part, dm / part)
    # the diffusers folder setup starts from (its schedulers and index; a copy: a link would lead outside the root)
    shutil.copytree(tiny_ckpt, root / "diffusers" / "MiniMax-H3", symlinks=False)
    return root


@contextlib.contextmanager
def _two_machines(tiny_ckpt, monkeypatch, again: list | None = None):
    """The two-machine layout (:func:`two_machine_layout`) with B's ``--model-root`` a ComfyUI ``models/`` tree and
    ``--transformer-file`` one of its files: yields ``(head address, B's models root)``. ``again``: gets a call that
    runs the same setup again."""
    def b_args(root):
        models = _b_models_tree(root / "b" / "models", tiny_ckpt)
        return ["--model-path", str(models / "diffusers" / "MiniMax-H3"), "--transformer-file",
                str(models / "diffusion_models" / NATIVE_DIT), "--model-root", str(models)]

    with two_machine_layout(monkeypatch, "h3m37_", b_args, again) as (head, root, out):
        models = root / "b" / "models"
        # setup names the file it loads the transformer from, not the folder (#37, item 9)
        assert f"loading transformer from {models / 'diffusion_models' / NATIVE_DIT}" in out.stdout, out.stdout
        yield head, models


def _remote_prompt(head: str, unet_name: str, name: str, **kw) -> dict:
    api = _core_model_prompt(True, name, **kw)
    api["4"]["inputs"].update(unet_name=unet_name, cluster_address=head)
    return api


def _b_health(server) -> dict:
    """B's worker as /h3/status shows it (one worker: every connection of this ComfyUI shows the same)."""
    bs = [a["health"]["B"] for a in _status(server)["actors"] if "health" in a]
    assert bs and len({b["pid"] for b in bs}) == 1, bs
    return bs[-1]


def _second_worker_budget(tiny_ckpt) -> int:
    """A budget (``H3_MEMORY_LIMIT_BYTES``) that fits one worker on :data:`NATIVE_DIT` (its plan, as B makes it:
    the file, the release's configs and canvas, fp32) but not two: 1.5 of one worker's need, margin kept."""
    from comfy_h3_nodes.engine.model import formats
    from comfy_h3_nodes.engine.model import memory_plan as mp

    src = formats.detect(fixture(tiny_ckpt, "transformer:pruned_bf16"), "transformer", formats.RELEASED_CONFIG_DIR)
    one = mp.choose_b_plan({"transformer": src}, "transformer", "auto", "auto", "float32", "cpu",
                           mp.default_canvas(formats.RELEASED_CONFIG_DIR), limit_bytes=10**12)
    return int(1.5 * one.need_bytes / (1 - mp.margin_fraction()))


@pytest.fixture(scope="module")
def two_machines_comfyui(tmp_path_factory, tiny_ckpt):
    """The two-machine layout (:func:`_two_machines`) and a ComfyUI on A joined to it, shared by this module's
    two-machine tests: ``(head, B's models root, server, setup_again)``. ComfyUI's environment carries a B budget
    (:func:`_second_worker_budget`) that only the workers it starts on B plan by (setup's worker measures B)."""
    again: list = []
    with pytest.MonkeyPatch.context() as mp:
        with _two_machines(tiny_ckpt, mp, again) as (head, models):
            mp.setenv("H3_MEMORY_LIMIT_BYTES", str(_second_worker_budget(tiny_ckpt)))
            with _started_comfyui(tmp_path_factory, tiny_ckpt) as server:
                yield head, models, server, again[0]


def test_core_ui_two_machines_a_name_means_one_file_with_b_root_a_models_tree(two_machines_comfyui):
    """Two machines, B's ``--model-root`` a ComfyUI ``models/`` tree: ComfyUI's own graph with H3RemoteModel runs on
    UNETLoader's name of a file (``minimax_h3_t2va_pruned_bf16.safetensors``, which B holds as
    ``diffusion_models/...``) and on a file only B has (A's ComfyUI never listed it: ComfyUI's own check lets B
    decide); once connected, the node's picker lists B's files by UNETLoader's names; a typo is refused in one
    sentence naming H3RemoteModel's unet_name and the names B has, and the next run runs; a typo of the worker's
    name (actor_name h3_dti beside B's h3_dit) is refused with the names B has, no second DiT started there."""
    head, models, server, _ = two_machines_comfyui
    pid, messages, _ = asyncio.run(_run(server, _remote_prompt(head, NATIVE_DIT, "core_ui_two_a")))
    _ok(messages, pid)
    b = _b_health(server)
    assert b["model"] == str(models / "diffusion_models" / NATIVE_DIT), b  # B's own file, not A's copy
    (note,) = [d["summary"]["status"] for d in _of(messages, "h3.timing", pid) if d["node"] == "4"]
    assert f"ComfyUI's MODEL of {NATIVE_DIT}" in note, note
    # the picker (what ComfyUI's page offers and checks) now lists B's files by UNETLoader's names
    listed = _http_json(server, "GET", "/object_info/H3RemoteModel")["H3RemoteModel"]["input"]["required"][
        "unet_name"][0]
    assert {NATIVE_DIT, B_ONLY, NATIVE_REF_DIT} <= set(listed) and not [n for n in listed if "/" in n], listed
    pid, messages, _ = asyncio.run(_run(server, _remote_prompt(head, B_ONLY, "core_ui_two_b")))
    _ok(messages, pid)
    assert _b_health(server)["model"] == str(models / "diffusion_models" / B_ONLY)
    typo = "minimax_h3_t2va_pruned_bf61.safetensors"
    pid, messages, _ = asyncio.run(_run(server, _remote_prompt(head, typo, "core_ui_two_c")))
    (err,) = _of(messages, "execution_error", pid)
    msg = err["exception_message"].strip()
    assert err["node_id"] == "4" and err["node_type"] == "H3RemoteModel", err
    assert msg.startswith(f"machine B has no model {typo!r} under its model roots ({models})"), msg
    assert "H3RemoteModel's unet_name" in msg and "H3RemoteDiT" not in msg and "\n" not in msg, msg
    assert f"B has: {', '.join(sorted([B_ONLY, NATIVE_REF_DIT, NATIVE_DIT]))} (B serves " in msg, msg
    pid, messages, _ = asyncio.run(_run(server, _remote_prompt(head, NATIVE_DIT, "core_ui_two_d")))
    _ok(messages, pid)
    # a typo of the worker's name: refused with the names B has, no second DiT started on B (#37, item 5)
    api = _remote_prompt(head, NATIVE_DIT, "core_ui_two_e")
    api["4"]["inputs"]["actor_name"] = "h3_dti"
    pid, messages, _ = asyncio.run(_run(server, api))
    (err,) = _of(messages, "execution_error", pid)
    said = err["exception_message"].strip()
    assert err["node_id"] == "4" and said.startswith(
        "actor_name 'h3_dti' names no DiT worker in namespace 'comfy_h3', and B already holds h3_dit: "), said
    assert "'new:h3_dti' to start another worker on purpose" in said, said
    names = [w["name"] for w in _status(server)["workers"] if w.get("machine", "B") == "B"]
    assert names == ["h3_dit"], names
    print(f"\n[h3 core_ui] two machines, B's root {models} (a models/ tree): {NATIVE_DIT} and {B_ONLY} ran "
          f"by UNETLoader's names; the typo was refused: {msg}")


def _loads(note: str) -> int:
    found = re.findall(r"(\d+) load\(s\)", note)
    assert len(found) == 1, note
    return int(found[0])


def _remote_note(messages, pid) -> str:
    (note,) = [d["summary"]["status"] for d in _of(messages, "h3.timing", pid) if d["node"] == "4"]
    return note


def test_core_ui_two_machines_b_keeps_its_load_count_and_counts_its_workers(two_machines_comfyui):
    """#37 items 9 and 5, read on H3RemoteModel's note and error in the two-machine layout: B's load count is its
    worker's since it started, so a reconfigure (H3RemoteModel picking another file) adds to it, and ``remote_worker
    setup`` run again on B re-uses the worker A reconfigured and keeps its count (it fell 5 -> 3 before); a second
    worker asked for in so many words (``new:h3_dit_2``) whose model would not fit beside the one B holds is refused
    before it loads, with the numbers, and B still holds only h3_dit."""
    head, models, server, setup_again = two_machines_comfyui
    pid, messages, _ = asyncio.run(_run(server, _remote_prompt(head, NATIVE_DIT, "core_ui_loads_a")))
    _ok(messages, pid)
    first = _remote_note(messages, pid)
    pid, messages, _ = asyncio.run(_run(server, _remote_prompt(head, B_ONLY, "core_ui_loads_b")))
    _ok(messages, pid)
    switched = _remote_note(messages, pid)
    assert "B reconfigured: model " in switched and "this reconfigure's among them" in switched, switched
    assert _loads(switched) > _loads(first), (first, switched)
    b = _b_health(server)
    out = setup_again()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "reconfigured by A since it was set up" in out.stdout and "re-using it" in out.stdout, out.stdout
    pid, messages, _ = asyncio.run(_run(server, _remote_prompt(head, B_ONLY, "core_ui_loads_c")))
    _ok(messages, pid)
    after = _remote_note(messages, pid)
    assert _b_health(server)["pid"] == b["pid"] and _loads(after) >= _loads(switched), (switched, after)
    # a second worker on purpose that would not fit beside h3_dit: refused before loading, with the numbers
    api = _remote_prompt(head, NATIVE_DIT, "core_ui_second_worker")
    api["4"]["inputs"]["actor_name"] = "new:h3_dit_2"
    pid, messages, _ = asyncio.run(_run(server, api))
    (err,) = _of(messages, "execution_error", pid)
    said = err["exception_message"].strip()
    assert err["node_id"] == "4" and "memory plan refused before loading anything: B plan (" in said, said
    assert re.search(r"less worker h3_dit's [\d.]+ [KM]iB\)", said), said
    assert said.endswith("options: set actor_name to h3_dit, which B holds"), said
    names = [w["name"] for w in _status(server)["workers"] if w.get("machine", "B") == "B"]
    assert names == ["h3_dit"], names
    print(f"\n[h3 core_ui] loads {_loads(first)} -> {_loads(switched)} (reconfigured) -> {_loads(after)} (setup "
          f"again); second worker: {said}")


@pytest.mark.parametrize("workflow, dit, said", [
    ("t2va", NATIVE_REF_DIT, f"H3RemoteModel's unet_name is a ref2va transformer ({NATIVE_REF_DIT}), but this graph "
                             "has no reference images"),
    ("i2va", NATIVE_REF_DIT, f"H3RemoteModel's unet_name is a ref2va transformer ({NATIVE_REF_DIT}), but this graph "
                             "has no reference images"),
    ("r2va", NATIVE_DIT, f"H3RemoteModel's unet_name is a t2va / i2va transformer ({NATIVE_DIT}), but this graph "
                         "conditions on reference images"),
])
def test_core_ui_a_transformer_of_another_workflow_is_refused_in_one_sentence(comfyui, workflow, dit, said):
    """ComfyUI's own t2va / i2va graph (MiniMaxH3ImageToVideo) with the ref2va file on H3RemoteModel, and its r2va
    graph (MiniMaxH3ReferenceToVideo) with the t2va file: refused at the first forward in one sentence that names
    the input and the way out (B would otherwise sample with the other workflow's weights); the right file runs."""
    api = _core_model_prompt(True, f"core_ui_wrong_{workflow}", workflow=workflow, steps=2)
    api["4"]["inputs"]["unet_name"] = dit
    pid, messages, _ = asyncio.run(_run(comfyui, api))
    (err,) = _of(messages, "execution_error", pid)
    msg = err["exception_message"].strip()
    assert msg.startswith(said) and msg.count(". ") == 0 and "\n" not in msg, msg
    assert "choose the" in msg and "unet_name" in msg, msg
    pid, messages, _ = asyncio.run(_run(comfyui, _core_model_prompt(True, f"core_ui_right_{workflow}",
                                                                    workflow=workflow, steps=2)))
    _ok(messages, pid)
    print(f"\n[h3 core_ui] {workflow} graph with {dit}: {msg}")


def _sampler_note(messages, pid) -> str:
    (t,) = [d for d in _of(messages, "h3.timing", pid) if d["node_type"] == "sampler"]
    return t["summary"]["status"]


def _wait_a_rank(server, released: bool, bound_s: float = 60.0) -> dict:
    deadline = time.monotonic() + bound_s
    while True:
        rank = _status(server)["a_rank"]
        if rank and bool(rank["released"]) == released or time.monotonic() > deadline:
            return rank
        time.sleep(0.5)


def test_core_ui_free_and_release_b_reach_the_ranks_h3remotemodel_started(comfyui):
    """``parallel`` A+B on H3RemoteModel: ComfyUI's /free (the Unload models button) releases A's DiT rank that
    H3RemoteModel started, as after the pack's own denoise; "Release B's model" (POST /h3/release_b) releases B's
    worker; each next run's sampler note says which machine reloaded its DiT first (A after /free, B after the
    release)."""
    api = _core_model_prompt(True, "core_ui_free", steps=2, parallel="A+B")
    pid, messages, _ = asyncio.run(_run(comfyui, api))
    _ok(messages, pid)
    assert "parallel: " in _sampler_note(messages, pid)
    rank = _wait_a_rank(comfyui, released=False)
    assert rank and rank["resident_bytes"], rank
    _http_json(comfyui, "POST", "/free", {"unload_models": True})
    freed = _wait_a_rank(comfyui, released=True)
    assert freed["released"] and freed["released"]["cause"] == "ComfyUI freed memory", freed
    assert freed["pid"] == rank["pid"] and freed["resident_bytes"] == {}, freed
    pid, messages, _ = asyncio.run(_run(comfyui, api))
    _ok(messages, pid)
    after_free = _sampler_note(messages, pid)
    assert re.search(r"A reloaded its DiT first \([\d.]+ s: it had been released\)", after_free), after_free
    assert "B reloaded" not in after_free, after_free
    out = _http_json(comfyui, "POST", "/api/h3/release_b", {})  # B's workers (A's rank is /free's, as before)
    assert out["released"] and out["missing"] == {}, out
    pid, messages, _ = asyncio.run(_run(comfyui, api))
    _ok(messages, pid)
    after_release = _sampler_note(messages, pid)
    assert re.search(r"B reloaded its DiT first \([\d.]+ s: it had been released\)", after_release), after_release
    assert "A reloaded" not in after_release, after_release
    print(f"\n[h3 core_ui] after /free: {after_free}\n[h3 core_ui] after Release B's model: {after_release}")


# ------------------------------------------------------------------------------------------------ the page
#: a readout on the page as the user sees it: its text, and whether it is drawn (laid out, on screen, inside its node)
JS_READOUT_SEEN = """(id) => {
    const n = window.app.graph.getNodeById(Number(id));
    const el = n?.widgets?.find((w) => w.name === 'h3_timing')?.element;
    if (!el) return null;
    const r = el.getBoundingClientRect();
    const hidden = getComputedStyle(el).visibility === 'hidden' || getComputedStyle(el).display === 'none';
    return {text: el.innerText, connected: el.isConnected, w: r.width, h: r.height, hidden,
            left: r.left, top: r.top, right: r.right, bottom: r.bottom,
            scroll: el.scrollHeight, client: el.clientHeight, vw: window.innerWidth, vh: window.innerHeight};
}"""


def _centre(page, node_id: str, shot: str) -> pathlib.Path:
    page.page.evaluate("(id) => { const n = window.app.graph.getNodeById(Number(id)); window.app.canvas.centerOnNode?.(n);"
                       " window.app.canvas.setDirty(true, true); }", node_id)
    page.settle(1000)
    return page.shot(shot)


def _covers(page, node_id: str, before: list[str]) -> list[str]:
    """What the node ``node_id`` lies over now that it was not over before (its readout grew it)."""
    return [o for o in overlaps(page.page.evaluate(JS_SHOWN_BOXES))
            if o not in before and f" {node_id} [" in o]


def _seen(page, node_id: str) -> dict:
    got = page.page.evaluate(JS_READOUT_SEEN, node_id)
    assert got is not None, f"node {node_id} has no readout on the page"
    assert got["connected"] and not got["hidden"] and got["w"] > 40 and got["h"] > 20, got
    assert got["scroll"] <= got["client"] + 1, f"the readout's text is cut: {got}"
    return got


@FRONTENDS
@MODES
def test_core_ui_sampler_and_remote_model_show_their_readouts_on_the_page(comfyui_frontends, browser, version, vue):
    """ComfyUI's own graph with H3RemoteModel and core's LoRA loader (strength 0.6), loaded into the page and queued
    from it: the sampler node that drove B (SamplerCustomAdvanced) shows its forwards on B, B's compute, the A->B and
    B->A hand-offs and the LoRA with its strength; H3RemoteModel shows its connection note and the file B serves;
    read from the page (the readout's text as drawn), in both frontends and both UI modes."""
    server = comfyui_frontends(version)
    api = _core_model_prompt(True, f"core_ui_page_{version}_{vue}", loras=((CORE_LORAS[0], 0.6),))
    page = ComfyPage(server, browser, vue=vue, version=version)
    try:
        page.page.evaluate("async (api) => { await window.app.loadApiJson(api, 'core_ui_readouts.json'); }", api)
        page.settle(800)
        page.page.keyboard.press("Escape")
        before = overlaps(page.page.evaluate(JS_SHOWN_BOXES))
        run = _queue_and_wait(page, picks={})
        (sampler,) = [t for t in run["timings"] if t["node_type"] == "sampler"]
        assert sampler["node"] == "10", sampler
        shot = _centre(page, "10", "core_ui_sampler_readout")
        seen = _seen(page, "10")
        flat = " ".join(seen["text"].split())
        assert flat.startswith("B sampling "), flat
        assert re.search(r"\d+ forwards on B \(h3_dit[^)]*\): B compute [\d.]+ s, A->B [\d.]+ s, B->A [\d.]+ s in all",
                         flat), flat
        assert re.search(r"per forward [\d.]+ s compute, [\d.]+ s transfer", flat), flat
        assert f"LoRA {CORE_LORAS[0]} at 0.6" in flat, flat
        _centre(page, "4", "core_ui_remote_model_readout")  # the classic canvas hides the DOM of nodes off screen
        model = " ".join(_seen(page, "4")["text"].split())
        assert model.startswith("B connect ") and f"ComfyUI's MODEL of {NATIVE_DIT}" in model, model
        covered = _covers(page, "10", before) + _covers(page, "4", before)
        assert not covered, f"a readout grew its node over another: {covered}"
        print(f"\n[h3 core_ui] {version} {page.mode}: sampler readout {flat!r}; H3RemoteModel {model!r} ({shot})")
        # the H3 panel (#37 item 8): the finished sampling is done, not drawn as running (dashed); one actor line each
        page.page.click(TAB_BUTTON)
        rid = sampler["stages"][0]["request_id"]
        page.page.wait_for_selector(f'.h3-panel .h3-request[data-request-id="{rid}"]')
        page.page.wait_for_function(f"() => document.querySelector('.h3-panel .h3-request[data-request-id=\"{rid}\"]')"
                                    "?.dataset.state === 'done'", timeout=15000)
        live = page.page.evaluate(f"() => document.querySelectorAll('.h3-panel .h3-request[data-request-id=\"{rid}\"] "
                                  ".h3-live').length")
        assert live == 0, f"the finished sampling is drawn as running ({live} dashed bars)"
        page.page.wait_for_selector(".h3-panel .h3-actor")
        actors = page.page.evaluate("() => [...document.querySelectorAll('.h3-panel .h3-actor')].map((e) => e.innerText)")
        assert actors and len(actors) == len(set(actors)), actors
        page.shot("core_ui_panel")
        page.assert_clean()
    finally:
        page.close()
        _http_json(server, "POST", f"/api/settings/{VUE_SETTING}", False)


CORE_I2V_TEMPLATE = "video_minimax_h3_i2v"  # ComfyUI's own: its UNETLoader sits over "Load LoRA" in a subgraph
#: the boxes of the nodes of the graph on screen (a subgraph once entered), in page pixels: a Vue node's element, or
#: the classic canvas's node (its title bar above ``pos``)
JS_SHOWN_BOXES = """() => {
  const c = window.app.canvas, ds = c.ds, rect = c.canvas.getBoundingClientRect();
  const title = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
  const sx = (x) => (x + ds.offset[0]) * ds.scale + rect.left, sy = (y) => (y + ds.offset[1]) * ds.scale + rect.top;
  return c.graph.nodes.map((n) => {
    const el = document.querySelector(`[data-node-id="${n.id}"]`);
    const r = el?.getBoundingClientRect();
    const box = r && r.width > 0 ? [r.left, r.top, r.right, r.bottom]
      : [sx(n.pos[0]), sy(n.pos[1] - title), sx(n.pos[0] + n.size[0]), sy(n.pos[1] + n.size[1])];
    return {id: String(n.id), type: n.type, title: n.title, box};
  });
}"""
#: after the swap: the H3RemoteModel's unet_name list, and the list the subgraph's node outside offers for it
JS_LISTS = """() => {
  const g = window.app.canvas.graph;
  const made = g.nodes.find((n) => n.type === 'H3RemoteModel');
  const holder = window.app.rootGraph.nodes.find((n) => n.subgraph === g);
  const promoted = (holder?.widgets ?? []).filter((w) => w.name === 'unet_name' || w.label === 'unet_name');
  return {made: [...(made.widgets.find((w) => w.name === 'unet_name').options.values ?? [])],
          promoted: promoted.map((w) => [...(w.options?.values ?? [])])};
}"""


@FRONTENDS
@MODES
def test_core_ui_swap_leaves_no_overlap_and_gives_the_promoted_widget_the_new_list(comfyui_frontends, browser,
                                                                                  version, vue):
    """ComfyUI's own ``video_minimax_h3_i2v`` (as the Templates dialog gets it), its subgraph entered and its
    UNETLoader swapped from the node's menu ("Run on machine B", a real right-click on its title): the taller
    H3RemoteModel covers no node (the nodes below it moved down; read from the page: Vue nodes' elements, the classic
    canvas's node boxes), and the subgraph's promoted unet_name on its node outside offers H3RemoteModel's list (B's
    files), not UNETLoader's."""
    server = comfyui_frontends(version)
    wf = _http_json(server, "GET", f"/templates/{CORE_I2V_TEMPLATE}.json")
    _http_json(server, "POST", f"/api/settings/{MISSING_MODELS_SETTING}", False)
    page = ComfyPage(server, browser, vue=vue, version=version)
    try:
        page.page.evaluate("async (wf) => { await window.app.loadGraphData(wf); }", wf)
        page.settle(800)
        page.page.keyboard.press("Escape")
        old = page.page.evaluate(JS_ENTER_UNETLOADER)
        if vue:
            page.page.wait_for_selector(f'[data-node-id="{old["id"]}"]', state="visible")
        page.settle(800)
        before = [o for o in overlaps(page.page.evaluate(JS_SHOWN_BOXES)) if "UNETLoader" not in o]
        x, y = page.page.evaluate(JS_TITLE_POINT, old["id"])
        page.page.mouse.click(x, y, button="right")
        entry = page.page.get_by_text("Run on machine B", exact=True)
        entry.first.wait_for(state="visible", timeout=10000)
        entry.first.click()
        page.page.wait_for_function("() => window.app.canvas.graph.nodes.some((n) => n.type === 'H3RemoteModel')")
        page.settle(1200)
        shot = page.shot("core_ui_swap_i2v_after")
        boxes = page.page.evaluate(JS_SHOWN_BOXES)
        now = [o for o in overlaps(boxes) if o not in before]
        assert not [o for o in now if "H3RemoteModel" in o], f"{now} ({shot})"
        assert not now, f"the swap moved nodes over others: {now} ({shot})"
        lists = page.page.evaluate(JS_LISTS)
        assert lists["made"] and all(p == lists["made"] for p in lists["promoted"]), lists
        assert lists["promoted"], "the subgraph's node outside shows no unet_name widget"
        page.assert_clean()
    finally:
        page.close()
        _http_json(server, "POST", f"/api/settings/{VUE_SETTING}", False)
        _http_json(server, "POST", f"/api/settings/{MISSING_MODELS_SETTING}", True)


@FRONTENDS
@MODES
def test_core_ui_a_refused_unet_name_reads_as_one_sentence_on_h3remotemodel(comfyui_frontends, browser, version, vue):
    """A unet_name B has not, queued from the page: H3RemoteModel shows "B connect failed" and B's sentence (naming
    its unet_name and the names B has) on the node, as the pack's own nodes show their errors, without a Python class
    prefix; read from the page in both frontends and both UI modes."""
    server = comfyui_frontends(version)
    api = _core_model_prompt(True, f"core_ui_refused_{version}_{vue}")
    api["4"]["inputs"]["unet_name"] = "minimax_h3_t2va_typo.safetensors"
    page = ComfyPage(server, browser, vue=vue, version=version)
    try:
        page.page.evaluate("async (api) => { await window.app.loadApiJson(api, 'core_ui_refused.json'); }", api)
        page.settle(800)
        page.page.keyboard.press("Escape")
        before = overlaps(page.page.evaluate(JS_SHOWN_BOXES))
        page.page.evaluate(QUEUE_LIKE_A_USER, [{}])
        page.page.wait_for_function("() => window.__h3run.end !== null", timeout=600000)
        run = page.page.evaluate("() => window.__h3run")
        assert run["end"] == "execution_error", run
        page.page.keyboard.press("Escape")  # the frontend's error dialog
        page.page.wait_for_function("() => !!window.app.graph.getNodeById(4)?.widgets?.find((w) => w.name === "
                                    "'h3_timing')", timeout=10000)
        shot = _centre(page, "4", "core_ui_refused_unet_name")
        text = " ".join(_seen(page, "4")["text"].split())
        assert text.startswith("B connect failed "), text
        assert "machine B has no model 'minimax_h3_t2va_typo.safetensors'" in text, text
        assert "H3RemoteModel's unet_name" in text and "B has: " in text and "Error:" not in text, text
        covered = _covers(page, "4", before)
        assert not covered, f"the readout grew H3RemoteModel over another node: {covered} ({shot})"
        print(f"\n[h3 core_ui] {version} {page.mode}: H3RemoteModel shows {text!r} ({shot})")
        page.assert_clean()
    finally:
        page.close()
        _http_json(server, "POST", f"/api/settings/{VUE_SETTING}", False)
