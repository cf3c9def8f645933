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
                                                                             "h3_t2va_turbo"}
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
