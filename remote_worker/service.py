"""``python -m remote_worker install-service``: a systemd unit that runs B's ``setup --block`` on boot and after a
failure, with absolute paths and the environment the pack reads."""

from __future__ import annotations

import getpass
import os
import pathlib
import shlex
import sys

from comfy_h3_nodes.engine.contract.versions import PACK_ROOT
from comfy_h3_nodes.engine.model import catalog


def setup_argv(args, parser) -> list[str]:
    """The `setup` command line the service runs, with absolute paths."""
    model = catalog.tiny_name(args.model_path) if catalog.is_tiny(args.model_path) else os.path.abspath(os.path.expanduser(args.model_path))
    out = ["setup", "--head", args.head, "--model-path", model]
    defaults = vars(parser.parse_args(["setup", "--head", "x:1", "--model-path", "x"]))
    skip = {"verb", "head", "model_path", "output", "user", "block", "json"}
    for key, value in vars(args).items():
        if key in skip or key not in defaults or value == defaults[key]:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag)
        elif isinstance(value, list):
            for v in value:
                out += [flag, os.path.abspath(os.path.expanduser(v)) if key == "model_root" else str(v)]
        else:
            v = str(value)
            if key in ("token_file", "temp_dir"):
                v = os.path.abspath(os.path.expanduser(v))
            out += [flag, v]
    return out + ["--block"]


def unit_text(args, parser) -> str:
    py = sys.executable
    argv = " ".join(shlex.quote(a) for a in setup_argv(args, parser))
    env = ["PYTHONUNBUFFERED=1", "HF_HUB_OFFLINE=1"]
    env += [f"{k}={os.environ[k]}" for k in ("H3_MODEL_ROOTS", "H3_PROFILE", "H3_STATE_DIR", "H3_PARALLEL_IFACE") if os.environ.get(k)]
    stop = [py, "-m", "remote_worker", "stop"]
    if args.temp_dir:
        stop += ["--temp-dir", os.path.abspath(args.temp_dir)]
    if args.token_file:
        stop += ["--token-file", os.path.abspath(os.path.expanduser(args.token_file))]
    return "\n".join([
        "[Unit]",
        "Description=comfy-h3: resident MiniMax-H3 DiT on machine B (Ray node + named actor)",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"User={args.user or getpass.getuser()}",
        f"WorkingDirectory={PACK_ROOT}",
        *[f"Environment={e}" for e in env],
        f"ExecStart={shlex.quote(py)} -m remote_worker {argv}",
        f"ExecStopPost={' '.join(shlex.quote(a) for a in stop)}",
        "Restart=on-failure",
        "RestartSec=15",
        "TimeoutStartSec=infinity",
        "TimeoutStopSec=90",
        "KillMode=mixed",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


def cmd_install_service(args, parser) -> int:
    out = pathlib.Path(args.output)
    text = unit_text(args, parser)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except PermissionError:
        print(f"cannot write {out} (permission denied): run with sudo, or pass --output PATH and copy it there", file=sys.stderr)
        return 1
    unit = out.name
    print(f"wrote {out}:\n")
    print(text)
    print("Enable and start it with:")
    if str(out.parent) != "/etc/systemd/system":
        print(f"  sudo cp {out} /etc/systemd/system/{unit}")
    print(f"  sudo systemctl daemon-reload && sudo systemctl enable --now {unit}")
    print(f"  journalctl -u {unit} -f        # its log; `python -m remote_worker status` for the actor")
    return 0


