"""Model pickers and the ``tiny-random`` choice: what A and B list, what a choice resolves to, one rule for settings
a running B does not serve (it is reconfigured, or one sentence names both values), and what really ran per request.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import threading

import pytest

import comfy_h3_nodes.nodes as N
from comfy_h3_nodes.tools import runner
from comfy_h3_nodes.engine.model import catalog
from comfy_h3_nodes.engine import session
from comfy_h3_nodes.host import LocalHost, set_host
from conftest import PROMPT

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _fake_model(folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir(parents=True)
    (folder / "modular_model_index.json").write_text("{}")
    (folder / "transformer").mkdir()
    (folder / "transformer" / "modular_model_index.json").write_text("{}")  # inside a checkpoint: not listed
    return folder


def test_find_models_lists_checkpoint_folders_under_the_roots(tmp_path):
    a = _fake_model(tmp_path / "root1" / "MiniMax-H3")
    b = _fake_model(tmp_path / "root1" / "vendor" / "FastH3-v1")
    _fake_model(tmp_path / "root1" / "x" / "y" / "too-deep")
    (tmp_path / "root1" / "not-a-model").mkdir()
    c = _fake_model(tmp_path / "root2" / "Other")
    found = catalog.find_models([tmp_path / "root1", tmp_path / "root2", tmp_path / "missing"])
    assert found == sorted([str(a), str(b), str(c)])
    assert catalog.choices([tmp_path / "root2"]) == ["Other", *catalog.TINY_CHOICES]  # named as ComfyUI names
    assert catalog.choices([tmp_path / "root1", tmp_path / "root2"]) == [
        "MiniMax-H3", "Other", "vendor/FastH3-v1", *catalog.TINY_CHOICES]
    roots = [tmp_path / "root1", tmp_path / "root2"]
    assert catalog.resolve("vendor/FastH3-v1", roots=roots) == str(b)  # each name leads back to its folder
    assert catalog.resolve("Other", roots=roots) == str(c)
    assert catalog.resolve(str(a), roots=roots) == str(a)  # an absolute path as typed
    assert catalog.choices([]) == [*catalog.TINY_CHOICES] == ["tiny-random-fasth3", "tiny-random"]


def test_load_encoders_picker_lists_a_model_folders_and_tiny(tmp_path, monkeypatch):
    model = _fake_model(tmp_path / "diffusers" / "MiniMax-H3")
    monkeypatch.setenv("H3_MODEL_DIRS", str(tmp_path / "diffusers"))
    set_host(LocalHost())
    choices, opts = N.H3LoadEncoders.INPUT_TYPES()["required"]["model_path"]
    assert choices == ["MiniMax-H3", *catalog.TINY_CHOICES] and opts["default"] == "MiniMax-H3"
    assert catalog.resolve("MiniMax-H3", roots=[tmp_path / "diffusers"]) == str(model)
    monkeypatch.setenv("H3_MODEL_DIRS", str(tmp_path / "none"))
    choices, opts = N.H3LoadEncoders.INPUT_TYPES()["required"]["model_path"]
    assert choices == [*catalog.TINY_CHOICES] and opts["default"] == catalog.TINY  # a newcomer's node just works


def test_a_model_path_is_checked_and_points_at_tiny_random(tmp_path, tiny_ckpt):
    assert N.H3LoadEncoders.VALIDATE_INPUTS(model_path=catalog.TINY) is True
    assert N.H3LoadEncoders.VALIDATE_INPUTS(model_path=str(tiny_ckpt)) is True  # a typed path still works
    msg = N.H3LoadEncoders.VALIDATE_INPUTS(model_path="/models/MiniMax-H3")
    assert "/models/MiniMax-H3 does not exist" in msg and "choose 'tiny-random'" in msg
    msg = N.H3LoadEncoders.VALIDATE_INPUTS(model_path=str(tmp_path))
    assert "no modular_model_index.json" in msg and "tiny-random" in msg


def test_a_model_picked_by_its_short_name_is_checked_and_loads(tmp_path, tiny_ckpt, monkeypatch):
    """The picker's name (relative to ComfyUI's diffusers folder) is what a saved workflow holds: it validates and
    loads that folder; a name under no root is refused naming it."""
    root = tmp_path / "diffusers"
    (root / "vendor").mkdir(parents=True)
    (root / "vendor" / "H3-tiny").symlink_to(tiny_ckpt, target_is_directory=True)
    monkeypatch.setenv("H3_MODEL_DIRS", str(root))
    set_host(LocalHost())
    assert "vendor/H3-tiny" in N.H3LoadEncoders.INPUT_TYPES()["required"]["model_path"][0]
    assert N.H3LoadEncoders.VALIDATE_INPUTS(model_path="vendor/H3-tiny") is True
    msg = N.H3LoadEncoders.VALIDATE_INPUTS(model_path="vendor/elsewhere")
    assert "vendor/elsewhere" in msg and "tiny-random" in msg
    out = N.H3LoadEncoders().load("vendor/H3-tiny", "float32", "sdpa")
    assert out["result"][0].model_dir.resolve() == pathlib.Path(tiny_ckpt).resolve()


def test_runner_accepts_a_typed_path_for_a_picker_and_refuses_a_missing_one(tiny_ckpt):
    api = runner.ui_to_api(json.loads((ROOT / "example_workflows" / "h3_t2va.json").read_text()))
    api["1"]["inputs"]["model_path"] = str(tiny_ckpt)  # not among the choices: like an API prompt
    api["2"]["inputs"]["model_path"] = "/somewhere/on/B"
    runner.check_prompt(api)
    api["1"]["inputs"]["model_path"] = "/models/MiniMax-H3"  # what the templates ship: clear error, the way out
    with pytest.raises(runner.WorkflowError, match="does not exist.*choose 'tiny-random'"):
        runner.check_prompt(api)


def test_tiny_random_is_built_once_when_asked_concurrently(tmp_path, monkeypatch):
    monkeypatch.setenv("H3_CACHE", str(tmp_path / "cache"))
    said, paths, errors = [], [], []

    def ask():
        try:
            paths.append(catalog.resolve(catalog.TINY, announce=said.append))
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(paths) == 2 and paths[0] == paths[1]
    assert len(said) == 1 and "generating the tiny random checkpoint" in said[0]
    assert (pathlib.Path(paths[0]) / "modular_model_index.json").is_file()
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")] == [f"tiny-h3-v{catalog.TINY_VERSION}-seed0"]
    assert catalog.resolve(catalog.TINY, announce=said.append) == paths[0] and len(said) == 1  # reused


# ------------------------------------------------------------------------------------------------ B side, live


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory, tiny_ckpt):
    """``tiny-random`` on both sides resolves into this cache (forwarded to the actors), prefilled with the session's
    tiny checkpoint so no test pays for a build."""
    cache = tmp_path_factory.mktemp("h3cache")
    os.symlink(tiny_ckpt, cache / f"tiny-h3-v{catalog.TINY_VERSION}-seed0")
    old = os.environ.get("H3_CACHE")
    os.environ["H3_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("H3_CACHE", None)
    else:
        os.environ["H3_CACHE"] = old


def _connect(name, model="tiny-random", dtype="float32", backend="sdpa", partition="transformer"):
    return N.H3RemoteDiT().connect("local", "new:" + name, "comfy_h3", model, partition, dtype, backend)


def test_tiny_random_on_both_sides_runs_and_b_lists_its_models(local_host, tiny_cache, tmp_path, monkeypatch):
    import ray

    _fake_model(tmp_path / "diffusers" / "Mine")
    session.A_MODEL_ROOTS[:] = []
    monkeypatch.setenv("H3_MODEL_DIRS", str(tmp_path / "diffusers"))
    out = _connect("h3_dit_pick")
    ex = out["result"][0]
    try:
        summary = out["ui"]["h3_timing"][0]["summary"]
        # the embedded cluster's B has no model roots of its own: it searched A's (named relative to the root, as
        # ComfyUI names its models), and offers tiny-random
        assert summary["b_models"] == ["Mine", *catalog.TINY_CHOICES]
        assert N.H3RemoteDiT.INPUT_TYPES()["required"]["model_path"][0] == ["Mine", *catalog.TINY_CHOICES]
        assert session.status()["models"]["B"] == ["Mine", *catalog.TINY_CHOICES]
        h = ray.get(ex.b.health.remote(), timeout=10)
        assert h["model"] == catalog.TINY and h["model_dir"] == os.path.realpath(tiny_cache / f"tiny-h3-v{catalog.TINY_VERSION}-seed0")
        enc = N.H3LoadEncoders().load(catalog.TINY, "float32", "sdpa")["result"][0]
        assert str(enc.model_dir) == os.path.realpath(tiny_cache / f"tiny-h3-v{catalog.TINY_VERSION}-seed0")
        cond = N.H3TextEncode().encode(enc, PROMPT, 64, 64, 124)["result"][0]
        res = asyncio.run(N.H3RemoteDenoise().denoise(ex, cond, 3, 3, unique_id="5"))
        ran = res["ui"]["h3_timing"][0]["summary"]["ran"]
        assert ran["model"] == catalog.TINY and ran["partition"] == "transformer" and ran["dtype"] == "float32"
    finally:
        ray.kill(ex.b, no_restart=True)
        session.forget("h3_dit_pick")


def test_a_setting_b_does_not_serve_is_applied_and_shown(local_host, tiny_cache, tiny_ckpt):
    """dtype and model differ from the running B: B is reconfigured, the node says so, the next request runs on it."""
    import ray

    first = _connect("h3_dit_reconf")["result"][0]
    try:
        pid = ray.get(first.b.health.remote(), timeout=10)["pid"]
        out = _connect("h3_dit_reconf", model=str(tiny_ckpt), dtype="bfloat16")
        ex = out["result"][0]
        summary = out["ui"]["h3_timing"][0]["summary"]
        assert "dtype float32 -> bfloat16" in summary["reconfigured"]
        assert f"model tiny-random -> {tiny_ckpt}" in summary["reconfigured"]
        assert "B reconfigured: " in out["ui"]["h3_timing"][0]["stages"][0]["note"]
        h = ray.get(ex.b.health.remote(), timeout=10)
        assert h["pid"] == pid and h["dtype"] == "bfloat16" and h["model"] == str(tiny_ckpt)  # same actor, reloaded
        assert ex.b_config_changes(h) == {}
        enc = N.H3LoadEncoders().load(str(tiny_ckpt), "bfloat16", "sdpa")["result"][0]
        cond = N.H3TextEncode().encode(enc, PROMPT, 64, 64, 124)["result"][0]
        res = asyncio.run(N.H3RemoteDenoise().denoise(ex, cond, 1, 3, unique_id="5"))
        assert res["ui"]["h3_timing"][0]["summary"]["ran"]["dtype"] == "bfloat16"
        # the first node's settings again: reconciled on reuse too (its executor is cached)
        again = _connect("h3_dit_reconf")
        assert "dtype bfloat16 -> float32" in again["ui"]["h3_timing"][0]["summary"]["reconfigured"]
    finally:
        ray.kill(first.b, no_restart=True)
        session.forget("h3_dit_reconf")


def test_a_setting_b_cannot_apply_is_one_sentence_with_both_values(local_host, tiny_cache):
    """flash attention on a CPU-only B: refused with both values and the fix; B keeps serving what it had."""
    import ray

    from comfy_h3_nodes.engine.contract.errors import H3Error

    ex = _connect("h3_dit_noflash")["result"][0]
    try:
        with pytest.raises(H3Error) as err:
            _connect("h3_dit_noflash", backend="flash")
        msg = str(err.value)
        assert "serves attention backend sdpa and this node asks for flash" in msg
        assert "Set the node to what B serves" in msg and "\n" not in msg
        h = ray.get(ex.b.health.remote(), timeout=10)
        assert h["attention_choice"] == "sdpa" and h["ok"]
        assert _connect("h3_dit_noflash")["ui"]["h3_timing"][0]["summary"]["reconfigured"] is None
    finally:
        ray.kill(ex.b, no_restart=True)
        session.forget("h3_dit_noflash")


def test_readout_says_which_partition_ran(local_host, tiny_cache, media):
    """ref2va on a B that holds ``transformer``: the denoise readout names transformer_ref and the swap."""
    import ray

    out = _connect("h3_dit_part")
    ex = out["result"][0]
    try:
        assert out["ui"]["h3_timing"][0]["summary"]["partition"] in ("transformer", "transformer + transformer_ref")
        enc = N.H3LoadEncoders().load(catalog.TINY, "float32", "sdpa")["result"][0]
        refs = N.References([media["ref"]], media["audio"])
        cond = N.H3TextEncode().encode(enc, PROMPT, 64, 64, 124, references=refs)["result"][0]
        res = asyncio.run(N.H3RemoteDenoise().denoise(ex, cond, 3, 3, unique_id="5"))
        timing = res["ui"]["h3_timing"][0]
        ran = timing["summary"]["ran"]
        assert ran["partition"] == "transformer_ref" and "transformer_ref" in ran["resident"]
        # B swapped (one partition resident) or held both (the memory plan allowed it); the readout says which
        assert ("swapped partition" in timing["summary"]["schedule"]) == (ran["swapped_s"] > 0)
        assert timing["summary"]["schedule"].startswith("3 sigma points on transformer_ref (float32, sdpa): ")
        host = ray.get(ex.b.health.remote(), timeout=10)["hostname"]
        assert {r["node"] for r in timing["stages"]} == {host}  # machines named by host name, as A's own nodes
    finally:
        ray.kill(ex.b, no_restart=True)
        session.forget("h3_dit_part")


def test_b_lists_transformer_files_and_runs_one_with_the_shipped_configs(local_host, tiny_cache, tiny_ckpt, tmp_path):
    """A single-file transformer under B's roots is a choice of H3RemoteDiT's picker (recognised by its keys: the name
    says nothing); chosen, B loads it as the node's partition with the release's scheduler configs the pack ships."""
    import shutil

    import ray

    from comfy_h3_nodes.engine.model import formats

    root = tmp_path / "diffusion_models"
    (root / "tiny" / "transformer").mkdir(parents=True)
    chosen = root / "tiny" / "whatever-name.safetensors"
    shutil.copy(tiny_ckpt / "single_file" / "transformer.safetensors", chosen)
    shutil.copy(tiny_ckpt / "transformer" / "config.json", root / "tiny" / "transformer" / "config.json")
    (root / "notes.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")  # not a transformer
    session.A_MODEL_ROOTS[:] = []
    os.environ["H3_MODEL_DIRS"] = str(root)
    try:
        out = _connect("h3_dit_file")
        assert out["ui"]["h3_timing"][0]["summary"]["b_models"] == ["tiny/whatever-name.safetensors",
                                                                     *catalog.TINY_CHOICES]
        file_out = _connect("h3_dit_file", model=str(chosen))  # an absolute path on B still works
    finally:
        os.environ.pop("H3_MODEL_DIRS")
    ex = file_out["result"][0]
    try:
        summary = file_out["ui"]["h3_timing"][0]["summary"]
        assert f"model tiny-random -> {chosen}" in summary["reconfigured"]
        assert summary["memory_plan"].startswith("B plan (")  # the node shows B's memory plan
        h = ray.get(ex.b.health.remote(), timeout=10)
        assert h["model_dir"] == str(formats.RELEASED_CONFIG_DIR)
        assert h["memory_plan"]["sources"]["transformer"] == {"kind": "single_file", "path": str(chosen)}
        enc = N.H3LoadEncoders().load(catalog.TINY, "float32", "sdpa")["result"][0]
        cond = N.H3TextEncode().encode(enc, PROMPT, 64, 64, 124)["result"][0]
        res = asyncio.run(N.H3RemoteDenoise().denoise(ex, cond, 3, 3, unique_id="5"))
        assert res["ui"]["h3_timing"][0]["summary"]["ran"]["model"] == str(chosen)
        assert "shift 12 (video) / 3 (audio)" in res["ui"]["h3_timing"][0]["summary"]["schedule"]
    finally:
        ray.kill(ex.b, no_restart=True)
        session.forget("h3_dit_file")


# ------------------------------------------------------------------------------------------------ B's short names


def _b_models_tree(root: pathlib.Path, tiny_ckpt) -> pathlib.Path:
    """A ComfyUI-like models/ root: the tiny checkpoint as a diffusers folder ``MiniMax-H3`` (a link) and its single
    transformer file in ``diffusion_models/`` (the tiny shapes' config beside it); returns the file."""
    import shutil

    (root / "diffusion_models" / "transformer").mkdir(parents=True)
    os.symlink(tiny_ckpt, root / "MiniMax-H3")
    f = root / "diffusion_models" / "minimax_h3_t2va_tiny.safetensors"
    shutil.copy(tiny_ckpt / "single_file" / "transformer.safetensors", f)
    shutil.copy(tiny_ckpt / "transformer" / "config.json", root / "diffusion_models" / "transformer" / "config.json")
    return f


def test_b_names_its_models_relative_to_its_roots_and_resolves_the_names(tmp_path, tiny_ckpt):
    """Names as ComfyUI's pickers give them; absolute where two roots give one name; B resolves a name against the
    first root holding it; an absolute path as typed; an unknown name is one sentence naming it and the roots."""
    from remote_worker import model_roots

    one, two = tmp_path / "one", tmp_path / "two"
    f = _b_models_tree(one, tiny_ckpt)
    _fake_model(two / "Other")
    roots = [str(one), str(one / "diffusion_models"), str(two)]
    assert catalog.named_models(roots) == ["MiniMax-H3", "Other", "diffusion_models/" + f.name,
                                           *catalog.TINY_CHOICES]  # the file by its first (outer) root
    _fake_model(two / "MiniMax-H3")  # two roots give the same name: both absolute
    assert catalog.named_models(roots)[:3] == sorted([str(one / "MiniMax-H3"), str(two / "MiniMax-H3"), "Other"])
    assert catalog.name_under(str(f), roots) == "diffusion_models/" + f.name
    assert catalog.name_under("/elsewhere/x.safetensors", roots) == "/elsewhere/x.safetensors"  # under no root

    config = {"model_dir": "Other", "model_roots": roots}
    assert model_roots.resolve_model(config, environ={}) == str(two / "Other")
    assert model_roots.resolve_model({**config, "model_dir": "MiniMax-H3"}, environ={}) == str(one / "MiniMax-H3")
    assert model_roots.resolve_model({"model_dir": "Other", "search_roots": [str(two)]}, environ={}) == str(two / "Other")
    assert model_roots.resolve_model({**config, "model_dir": str(f)}, environ={}) == str(f)
    assert model_roots.resolve_model({**config, "model_dir": catalog.TINY}, environ={}) == catalog.TINY
    with pytest.raises(model_roots.ModelRootError) as err:
        model_roots.resolve_model({**config, "model_dir": "Nope"}, environ={})
    assert str(err.value) == f"machine B has no model 'Nope' under its model roots ({', '.join(roots)})"


def test_one_name_means_one_file_whatever_layout_b_roots_have(tmp_path, tiny_ckpt):
    """UNETLoader's name of a transformer file (``X``, relative to ``diffusion_models``) and the name under a
    ``models/`` root (``diffusion_models/X``) resolve to the same file with B's root a ComfyUI ``models/`` tree, its
    ``diffusion_models`` folder or a plain folder of files; H3RemoteModel's picker lists UNETLoader's names; a name
    B lacks is refused naming the input it came from and the names B has."""
    import shutil

    from comfy_h3_nodes.nodes.core_model import ASKED_BY, unet_names
    from remote_worker import model_roots

    f = _b_models_tree(tmp_path / "models", tiny_ckpt)
    flat = tmp_path / "files"
    flat.mkdir()
    shutil.copy(f, flat / f.name)
    for root, file in ((tmp_path / "models", f), (tmp_path / "models" / "diffusion_models", f), (flat, flat / f.name)):
        for name in (f.name, "diffusion_models/" + f.name):
            assert model_roots.resolve_model({"model_dir": name, "model_roots": [str(root)]}, environ={}) == str(file)
        assert unet_names(catalog.named_models([str(root)])) == [f.name], root
    config = {"model_dir": "minimax_h3_t2va_typo.safetensors", "model_roots": [str(tmp_path / "models")],
              "asked_by": ASKED_BY}
    msg = model_roots.preflight(config)
    assert msg == (f"machine B has no model 'minimax_h3_t2va_typo.safetensors' under its model roots "
                   f"({tmp_path / 'models'}); choose a model B has in H3RemoteModel's unet_name, or 'tiny-random' to "
                   f"try the pack without weights. B has: {f.name}."), msg
    msg = model_roots.preflight({**config, "asked_by": ""})  # H3RemoteDiT's: its folders and files, as it lists them
    assert "in H3RemoteDiT's model_path" in msg and msg.endswith(f"B has: MiniMax-H3, diffusion_models/{f.name}.")


def test_remote_dit_lists_b_models_before_any_run_in_local_mode(local_host, tiny_ckpt, tmp_path, monkeypatch):
    """ComfyUI's node list (INPUT_TYPES) offers what the embedded B finds under A's folders before any run: the
    cluster joined as ``local``, or not joined yet (the node's default); no connection to a B is needed."""
    f = _b_models_tree(tmp_path / "models", tiny_ckpt)
    monkeypatch.setenv("H3_MODEL_DIRS", str(tmp_path / "models"))
    want = ["MiniMax-H3", "diffusion_models/" + f.name, *catalog.TINY_CHOICES]
    choices, opts = N.H3RemoteDiT.INPUT_TYPES()["required"]["model_path"]
    assert choices == want and opts["default"] == "MiniMax-H3"
    assert "builds or refreshes its node list" in opts["tooltip"]
    assert session.status()["models"]["B"] == want
    monkeypatch.setattr(session.CLUSTER, "mode", "")  # ComfyUI just started: nothing joined yet
    assert N.H3RemoteDiT.INPUT_TYPES()["required"]["model_path"][0] == want


def test_a_name_b_lists_runs_an_absolute_path_too_and_an_unknown_name_is_refused(local_host, tiny_cache, tiny_ckpt,
                                                                                  tmp_path, monkeypatch):
    """The names B lists are what H3RemoteDiT sends: B resolves them (on start and on a reconfigure), serves the
    same model under its absolute path without reloading, and refuses a name it cannot find in one sentence; a LoRA
    named under the same roots resolves the same way."""
    import ray

    from comfy_h3_nodes.engine.contract.errors import ModelFolderError

    root = tmp_path / "models"
    _b_models_tree(root, tiny_ckpt)
    monkeypatch.setenv("H3_MODEL_DIRS", str(root))
    roots = ", ".join([str(root), str(root / "diffusion_models"), str(root / "unet")])
    first = _connect("h3_dit_names")["result"][0]
    try:
        out = _connect("h3_dit_names", model="MiniMax-H3")  # a reconfigure to a name: B resolves it
        ex = out["result"][0]
        assert "model tiny-random -> MiniMax-H3" in out["ui"]["h3_timing"][0]["summary"]["reconfigured"]
        h = ray.get(ex.b.health.remote(), timeout=10)
        assert h["model"] == str(root / "MiniMax-H3") and h["model_name"] == "MiniMax-H3"
        enc = N.H3LoadEncoders().load(str(tiny_ckpt), "float32", "sdpa")["result"][0]
        cond = N.H3TextEncode().encode(enc, PROMPT, 64, 64, 124)["result"][0]
        res = asyncio.run(N.H3RemoteDenoise().denoise(ex, cond, 1, 3, unique_id="5"))
        assert res["ui"]["h3_timing"][0]["summary"]["ran"]["model"] == str(root / "MiniMax-H3")
        # a LoRA by its name under the same roots (H3LoRA's default is such a name): B resolves it like a model
        from comfy_h3_nodes.engine.model.tiny import build_tiny_lora
        from comfy_h3_nodes.nodes.values import DiT

        lora = build_tiny_lora(root / "loras" / "turbo.safetensors", seed=3, steps=4, shift=5.0)
        lora_ui = N.H3LoRA().apply(DiT(ex, ()), "loras/turbo.safetensors", 1.0, unique_id="9")["ui"]
        assert lora_ui["h3_timing"][0]["summary"]["resolved"] == str(lora.resolve())
        with pytest.raises(Exception, match=r"no model 'loras/nope.safetensors' under its model roots"):
            N.H3LoRA().apply(DiT(ex, ()), "loras/nope.safetensors", 1.0, unique_id="9")
        # the same model by its name again, or by its absolute path (saved workflows): nothing reloads
        assert _connect("h3_dit_names", model="MiniMax-H3")["ui"]["h3_timing"][0]["summary"]["reconfigured"] is None
        assert _connect("h3_dit_names", model=str(root / "MiniMax-H3"))["ui"]["h3_timing"][0]["summary"][
            "reconfigured"] is None
        with pytest.raises(ModelFolderError) as err:  # a running B keeps its model and says why not
            _connect("h3_dit_names", model="Nope")
        msg = str(err.value)
        assert msg.startswith(f"machine B has no model 'Nope' under its model roots ({roots}); choose a model B has "
                              "in H3RemoteDiT's model_path, or 'tiny-random'") and "\n" not in msg
        assert ray.get(ex.b.health.remote(), timeout=10)["model_name"] == "MiniMax-H3"
    finally:
        ray.kill(first.b, no_restart=True)
        session.forget("h3_dit_names")
    with pytest.raises(ModelFolderError) as err:  # a new worker: refused before it starts
        _connect("h3_dit_names_new", model="Nope")
    assert str(err.value).startswith(f"machine B has no model 'Nope' under its model roots ({roots}); choose a model "
                                     "B has in H3RemoteDiT's model_path, or 'tiny-random' to try the pack without "
                                     "weights. B has: MiniMax-H3, ")
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("h3_dit_names_new")]
    # a new worker started on a name (the file under diffusion_models/) runs it as the node's partition
    out = _connect("h3_dit_names_file", model="diffusion_models/minimax_h3_t2va_tiny.safetensors")
    ex = out["result"][0]
    try:
        h = ray.get(ex.b.health.remote(), timeout=10)
        assert h["model"] == str(root / "diffusion_models" / "minimax_h3_t2va_tiny.safetensors")
        assert h["model_name"] == "diffusion_models/minimax_h3_t2va_tiny.safetensors"
        assert out["ui"]["h3_timing"][0]["summary"]["b_models"][:2] == [
            "MiniMax-H3", "diffusion_models/minimax_h3_t2va_tiny.safetensors"]
    finally:
        ray.kill(ex.b, no_restart=True)
        session.forget("h3_dit_names_file")
