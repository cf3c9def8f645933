"""The pack's install surface: requirements for ComfyUI-Manager, install.py, pyproject's [tool.comfy]."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _install_module():
    spec = importlib.util.spec_from_file_location("h3_install", ROOT / "install.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_requirements_never_name_torch_and_match_pyproject():
    reqs = _install_module().requirements()
    assert reqs and not any(r.lower().startswith(("torch", "torchvision", "torchaudio")) for r in reqs)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert sorted(project["dependencies"]) == sorted(reqs)


def test_install_py_filters_torch_even_if_listed(tmp_path, monkeypatch):
    mod = _install_module()
    fake = tmp_path / "requirements.txt"
    fake.write_text("diffusers>=0.42.1\ntorch==2.13.0  # never\ntorchaudio\nray[default]>=2.60,<2.61\n")
    monkeypatch.setattr(mod, "HERE", tmp_path)
    assert mod.requirements() == ["diffusers>=0.42.1", "ray[default]>=2.60,<2.61"]


def test_install_py_runs_pip_with_this_python(tmp_path):
    """install.py calls pip of the interpreter running it (the call is intercepted here: nothing is installed)."""
    code = ("import json, runpy, subprocess\n"
            "subprocess.call = lambda args: print('CALL', json.dumps(args)) or 0\n"
            f"runpy.run_path(r'{ROOT / 'install.py'}', run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import json

    call = json.loads(next(l for l in out.stdout.splitlines() if l.startswith("CALL "))[5:])
    assert call[:4] == [sys.executable, "-m", "pip", "install"]
    assert "diffusers>=0.42.1" in call and not any(a.startswith("torch") for a in call)


def test_comfy_registry_metadata_and_pack_layout():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    comfy = meta["tool"]["comfy"]
    assert comfy["PublisherId"] and comfy["DisplayName"]
    assert meta["project"]["name"] and meta["project"]["version"] and meta["project"]["urls"]["Repository"]
    assert 'WEB_DIRECTORY = "./web"' in (ROOT / "__init__.py").read_text()
    assert {p.stem for p in (ROOT / "example_workflows").glob("*.json")} >= {"h3_t2va", "h3_fl2va", "h3_ref2va",
                                                                             "h3_t2va_turbo", "h3_core_t2va",
                                                                             "h3_core_i2va", "h3_core_r2va"}
    assert (ROOT / "web" / "h3_extension.js").is_file()


def test_pack_version_comes_from_the_checkout_pyproject(tmp_path):
    """A git clone in custom_nodes/ has no package metadata: A and B still compare real pack versions."""
    from comfy_h3_nodes.engine.contract.versions import pack_version, versions

    own = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert versions()["comfy-h3"] == pack_version() == own
    other = tmp_path / "pyproject.toml"
    other.write_text('[project]\nname = "comfy-h3"\nversion = "9.9.9"\n')
    assert pack_version(other) == "9.9.9"
    other.write_text('[project]\nname = "something-else"\nversion = "1.0"\n')
    assert pack_version(other) != "1.0"  # another project's file is never read as ours


def test_install_py_copies_example_inputs_into_comfyuis_input_without_overwriting(tmp_path):
    """Run from ComfyUI/custom_nodes/comfy-h3 (a copy of the pack's install.py and inputs): the inputs land in
    ComfyUI/input, a file the user already has there stays as it was."""
    import shutil

    comfy = tmp_path / "ComfyUI"
    pack = comfy / "custom_nodes" / "comfy-h3"
    (pack / "example_workflows").mkdir(parents=True)
    shutil.copy(ROOT / "install.py", pack)
    shutil.copy(ROOT / "requirements.txt", pack)
    shutil.copytree(ROOT / "example_workflows" / "inputs", pack / "example_workflows" / "inputs")
    (comfy / "main.py").write_text("")
    (comfy / "input").mkdir()
    (comfy / "input" / "h3_first.png").write_bytes(b"the user's own file")
    out = subprocess.run([sys.executable, str(pack / "install.py"), "--no-pip"], capture_output=True, text=True,
                         timeout=60, cwd=pack)
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in (ROOT / "example_workflows" / "inputs").iterdir())
    assert sorted(p.name for p in (comfy / "input").iterdir()) == names
    assert (comfy / "input" / "h3_first.png").read_bytes() == b"the user's own file"
    for name in names:
        if name != "h3_first.png":
            assert (comfy / "input" / name).read_bytes() == (ROOT / "example_workflows" / "inputs" / name).read_bytes()
    assert "(not overwritten): h3_first.png" in out.stdout
    elsewhere = tmp_path / "custom_input"
    out = subprocess.run([sys.executable, str(pack / "install.py"), "--no-pip", "--input-dir", str(elsewhere)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and sorted(p.name for p in elsewhere.iterdir()) == names


# ------------------------------------------------------------------------------------------------ ComfyUI's env
def _comfyui_env_module():
    spec = importlib.util.spec_from_file_location("h3_comfyui_env", ROOT / "scripts" / "comfyui_env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_comfyui_env_is_rebuilt_when_comfyuis_or_the_packs_requirements_change(tmp_path, monkeypatch):
    """make test-comfyui's environment (scripts/comfyui_env.py) is keyed by what it installs: ComfyUI's
    requirements.txt, the pack's requirements.txt and install.py; anything else leaves the cached one in place."""
    env = _comfyui_env_module()
    comfy = tmp_path / "ComfyUI"
    comfy.mkdir()
    (comfy / "requirements.txt").write_text("torch\naiohttp\n")
    repo = tmp_path / "pack"
    repo.mkdir()
    for name in ("requirements.txt", "install.py"):
        (repo / name).write_text((ROOT / name).read_text())
    (repo / "README.md").write_text("x")
    monkeypatch.setattr(env, "REPO", repo)
    key = env.env_key(comfy)
    assert env.env_key(comfy) == key
    (repo / "README.md").write_text("y")
    assert env.env_key(comfy) == key
    (comfy / "requirements.txt").write_text("torch\naiohttp\nav>=16\n")
    assert env.env_key(comfy) != key
    key = env.env_key(comfy)
    (repo / "requirements.txt").write_text((repo / "requirements.txt").read_text() + "einops\n")
    assert env.env_key(comfy) != key
    key = env.env_key(comfy)
    (repo / "install.py").write_text((repo / "install.py").read_text() + "\n# changed\n")
    assert env.env_key(comfy) != key


def test_comfyui_env_torchvision_patch_skips_only_the_missing_op_and_applies_once(tmp_path):
    """The CPU work-around for PyPI's CUDA torchvision: its register_fake decorators become a guard that skips the
    fake kernel only when the op does not exist (any other error still raises), and patching twice changes nothing."""
    env = _comfyui_env_module()
    pkg = tmp_path / "torchvision"
    pkg.mkdir()
    (pkg / "_meta_registrations.py").write_text(
        "import torch\n\n\n"
        "@torch.library.register_fake('h3test::missing_op')\n"
        "def meta_missing(x):\n    return x\n\n\n"
        "@torch.library.register_fake('h3test::also_missing')\n"
        "def meta_also(x):\n    return x\n")
    unpatched = subprocess.run([sys.executable, str(pkg / "_meta_registrations.py")], capture_output=True, text=True,
                               timeout=120)
    assert "operator h3test::missing_op does not exist" in unpatched.stderr  # what stops ComfyUI from loading
    env.patch_torchvision(tmp_path)
    once = (pkg / "_meta_registrations.py").read_text()
    env.patch_torchvision(tmp_path)
    assert (pkg / "_meta_registrations.py").read_text() == once
    assert once.count("@_h3_register_fake(") == 2 and "@torch.library.register_fake(" not in once
    code = once + ("\ndef boom(name):\n    raise RuntimeError('something else went wrong')\n"
                   "torch.library.register_fake = lambda name: boom(name)\n"
                   "try:\n    _h3_register_fake('h3test::x')(len)\nexcept RuntimeError as e:\n    print('raised', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr  # the missing ops are skipped: the module imports
    assert "raised something else went wrong" in proc.stdout  # other errors are not swallowed
