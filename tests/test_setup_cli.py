"""Machine B's command line without a cluster: preflight failures with their fixes, model roots, the systemd unit,
and ``status`` against a cluster that is not there. Nothing here starts Ray."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from comfy_h3_nodes.engine.model import catalog
from comfy_h3_nodes.cluster import ray_node as rn
from remote_worker import cli, model_roots

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNREACHABLE_HEAD = "127.0.0.2:9"  # loopback, nothing listens on port 9: refused at once


def fake_checkpoint(path, components=("transformer", "scheduler", "audio_scheduler")):
    """A folder with the layout preflight checks (the index and non-empty component folders)."""
    path.mkdir(parents=True)
    (path / "modular_model_index.json").write_text("{}")
    for c in components:
        (path / c).mkdir()
        (path / c / "config.json").write_text("{}")
    return path


def preflight(capsys, *args):
    rc = cli.main(["preflight", "--head", UNREACHABLE_HEAD, "--allow-cpu", *args])
    out = capsys.readouterr().out
    return rc, out


def line_and_fix(out: str, name: str) -> tuple[str, str]:
    lines = out.splitlines()
    for i, ln in enumerate(lines):
        if ln.strip().startswith(("PASS", "FAIL")) and ln.split()[1:2] == name.split()[:1] and name in ln:
            fix = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].strip().startswith("fix:") else ""
            return ln.strip(), fix
    raise AssertionError(f"no {name!r} line in:\n{out}")


def test_preflight_reports_missing_component(tmp_path, capsys):
    ckpt = fake_checkpoint(tmp_path / "models" / "h3", components=("transformer", "audio_scheduler"))
    rc, out = preflight(capsys, "--model-path", str(ckpt), "--expect-versions", json.dumps(rn.local_versions()))
    assert rc != 0
    line, fix = line_and_fix(out, "model folder")
    assert line.startswith("FAIL") and "'scheduler'" in line and str(ckpt) in line
    assert fix.startswith("fix:") and "scheduler/" in fix
    # the versions given match this machine: that check passes and the summary counts the failures
    assert line_and_fix(out, "packages")[0].startswith("PASS")
    assert "failed" in out.splitlines()[-1]


def test_preflight_reports_address_not_on_interface(tmp_path, capsys):
    ckpt = fake_checkpoint(tmp_path / "models" / "h3")
    rc, out = preflight(capsys, "--model-path", str(ckpt), "--iface", "lo", "--node-ip", "10.123.45.67")
    assert rc != 0
    line, fix = line_and_fix(out, "interface")
    assert line.startswith("FAIL") and "10.123.45.67 is not on interface lo" in line
    assert "--iface" in fix and "ip -br addr" in fix
    # a missing interface is reported the same way
    rc, out = preflight(capsys, "--model-path", str(ckpt), "--iface", "h3nosuchif0")
    line, fix = line_and_fix(out, "interface")
    assert rc != 0 and line.startswith("FAIL") and "'h3nosuchif0' does not exist" in line and fix


def test_preflight_reports_version_mismatch(tmp_path, capsys):
    ckpt = fake_checkpoint(tmp_path / "models" / "h3")
    a_versions = dict(rn.local_versions(), torch="9.9.9", python="3.99.1")
    (tmp_path / "a_versions.json").write_text(json.dumps(a_versions))
    rc, out = preflight(capsys, "--model-path", str(ckpt), "--expect-versions", str(tmp_path / "a_versions.json"))
    assert rc != 0
    line, fix = line_and_fix(out, "packages")
    assert line.startswith("FAIL") and "torch" in line and "9.9.9 on A" in line
    assert "pip install torch==9.9.9" in fix
    line, fix = line_and_fix(out, "python")
    assert line.startswith("FAIL") and "3.99.1 on A" in line and "Python 3.99.1" in fix
    # the other checks still ran and the head that is not there is reported with its fix
    line, fix = line_and_fix(out, "head reachable")
    assert line.startswith("FAIL") and "start-head" in fix


def test_preflight_without_a_versions_says_how_to_get_them(tmp_path, capsys):
    ckpt = fake_checkpoint(tmp_path / "models" / "h3")
    rc, out = preflight(capsys, "--model-path", str(ckpt))
    line, fix = line_and_fix(out, "packages")
    assert rc != 0 and line.startswith("FAIL") and "unknown" in line and "--expect-versions" in fix


def test_model_path_outside_roots_is_refused(tmp_path, capsys):
    root = tmp_path / "models"
    root.mkdir()
    elsewhere = fake_checkpoint(tmp_path / "elsewhere" / "h3")
    traversal = f"{root}/../elsewhere/h3"
    # the command line refuses it in preflight, naming the path and the roots
    rc, out = preflight(capsys, "--model-path", traversal, "--model-root", str(root))
    line, fix = line_and_fix(out, "model roots")
    assert rc != 0 and line.startswith("FAIL")
    assert traversal in line and str(elsewhere) in line and str(root) in line and "--model-root" in fix

    # the actor itself refuses it before reading anything: by its config ...
    from remote_worker.actor import DiTActorImpl

    with pytest.raises(model_roots.ModelRootError) as err:
        DiTActorImpl({"model_dir": traversal, "model_roots": [str(root)], "partition": "transformer"})
    assert traversal in str(err.value) and str(root) in str(err.value) and "outside" in str(err.value)
    # ... by the node's H3_MODEL_ROOTS, whatever the config says ...
    with pytest.raises(model_roots.ModelRootError, match="H3_MODEL_ROOTS"):
        model_roots.enforce({"model_dir": traversal, "model_roots": [str(tmp_path)]},
                            environ={"H3_MODEL_ROOTS": f"{root}:{tmp_path}/other"})
    # ... and through a symlink inside the root that points out of it
    (root / "link").symlink_to(elsewhere)
    with pytest.raises(model_roots.ModelRootError, match="resolves to"):
        model_roots.enforce({"model_dir": str(root / "link"), "model_roots": [str(root)]}, environ={})
    # a folder really inside a root passes; with no roots configured anywhere nothing is restricted
    inside = fake_checkpoint(root / "h3")
    assert model_roots.enforce({"model_dir": f"{root}/./h3", "model_roots": [str(root)]}, environ={}) == inside
    assert model_roots.enforce({"model_dir": traversal}, environ={}) == elsewhere


def test_default_model_root_is_the_parent_of_model_path(tmp_path):
    args = cli.parser().parse_args(["setup", "--head", "10.0.0.1:6379", "--model-path", str(tmp_path / "m" / "h3")])
    env_before = os.environ.pop(model_roots.ENV, None)
    try:
        assert cli.model_roots_of(args) == [str(tmp_path / "m")]
    finally:
        if env_before is not None:
            os.environ[model_roots.ENV] = env_before


def test_install_service_writes_a_restarting_unit(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("H3_PARALLEL_IFACE", "enp1s0")  # parallel denoise: the ranks' gloo/NCCL interface
    ckpt = fake_checkpoint(tmp_path / "models" / "h3")
    token = tmp_path / "token"
    token.write_text("x" * 64)
    unit = tmp_path / "systemd" / "comfy-h3-dit.service"
    rc = cli.main(["install-service", "--head", "192.168.100.1:6379", "--model-path", str(ckpt), "--iface", "enp1s0",
                   "--token-file", str(token), "--partition", "transformer_ref", "--output", str(unit)])
    out = capsys.readouterr().out
    assert rc == 0, out
    text = unit.read_text()
    assert "Restart=on-failure" in text and "[Install]" in text and "WantedBy=multi-user.target" in text
    exec_start = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    for part in (sys.executable, "-m remote_worker setup", "--head 192.168.100.1:6379", f"--model-path {ckpt}",
                 "--iface enp1s0", f"--token-file {token}", "--partition transformer_ref", "--block"):
        assert part in exec_start, exec_start
    assert any(ln.startswith("ExecStopPost=") and "remote_worker stop" in ln for ln in text.splitlines())
    assert "Environment=H3_PARALLEL_IFACE=enp1s0" in text.splitlines()
    assert "systemctl daemon-reload" in out and "systemctl enable --now comfy-h3-dit.service" in out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        return s.getsockname()[1]


def _run_cli(args, tmp_path, timeout=30):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(H3_STATE_DIR=str(tmp_path / "state"), PYTHONPATH=REPO)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "remote_worker", *args], capture_output=True, text=True,
                         timeout=timeout, env=env, cwd=REPO)
    return out, time.monotonic() - t0


def test_status_against_a_missing_cluster_fails_fast(tmp_path):
    out, seconds = _run_cli(["status", "--head", f"127.0.0.2:{_free_port()}"], tmp_path)
    assert out.returncode != 0
    assert "not reachable" in out.stderr and "start-head" in out.stderr, out.stderr
    assert seconds < 10, seconds
    # with neither a previous setup nor --head, it says so
    out, seconds = _run_cli(["status"], tmp_path)
    assert out.returncode != 0 and "no B node set up here" in out.stderr and seconds < 10


def test_cluster_cli_versions_and_bad_iface(capsys):
    from comfy_h3_nodes.cluster import cli as cli_cluster

    assert cli_cluster.main(["versions"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["python"] and v["wire_schema"] and v == rn.local_versions()
    assert cli_cluster.main(["start-head", "--iface", "h3nosuchif0"]) != 0
    assert "does not exist" in capsys.readouterr().err
    assert cli_cluster.main(["start-head", "--iface", "lo"]) != 0  # lo holds 127.0.0.1: Ray would hang
    assert "127.0.0.1" in capsys.readouterr().err


def test_tiny_random_on_b_is_built_there_and_passes_preflight(tmp_path, capsys, monkeypatch, tiny_ckpt):
    """`setup --model-path tiny-random`: B builds the tiny model in its own cache (here prefilled from the session's
    build) and the model folder check passes; the unit and the printed node values keep the name tiny-random."""
    cache = tmp_path / "cache"
    cache.mkdir()
    os.symlink(tiny_ckpt, cache / f"tiny-h3-v{catalog.TINY_VERSION}-seed0")
    monkeypatch.setenv("H3_CACHE", str(cache))
    monkeypatch.delenv(model_roots.ENV, raising=False)
    rc, out = preflight(capsys, "--model-path", "tiny-random")
    line, _ = line_and_fix(out, "model folder")
    assert line.startswith("PASS") and os.path.realpath(tiny_ckpt) in line
    args = cli.parser().parse_args(["setup", "--head", "10.0.0.1:6379", "--model-path", "tiny-random"])
    cli.options_of(args)
    assert args.tiny and cli._model_choice(args, tiny_ckpt) == "tiny-random"
    unit = tmp_path / "unit.service"
    assert cli.main(["install-service", "--head", "192.168.100.1:6379", "--model-path", "tiny-random",
                     "--output", str(unit)]) == 0
    assert "--model-path tiny-random" in unit.read_text()
