"""``python -m comfy_h3_nodes cluster VERB``: machine A's Ray head (see docs/two_spark_setup.md).

Verbs:
  start-head  start the Ray head on A: token auth (a 0600 token file is generated when missing), bound to the
              address of --iface, role A, object store capped, dashboard off (or on 127.0.0.1 with --dashboard),
              faster node-death detection; publishes A's versions for B's preflight and prints B's command
  stop        stop A's Ray head (only the processes of our node; run `python -m remote_worker stop` on B first)
  status      the cluster's nodes and roles, from the head
  versions    A's Python and package versions as JSON (for `remote_worker setup --expect-versions`)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import sys
import time

from . import ray_node as rn

DEFAULT_OBJECT_STORE_MB = 2048


def _die(msg: str, code: int = 1) -> int:
    print(msg, file=sys.stderr, flush=True)
    return code


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m comfy_h3_nodes cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True)
    sh = sub.add_parser("start-head", help="start A's Ray head with token auth")
    sh.add_argument("--iface", default=None, help="the interface to bind to (the QSFP link to B)")
    sh.add_argument("--node-ip", default=None, help="A's address (default: the interface's IPv4 address)")
    sh.add_argument("--port", type=int, default=6379, help="the head's GCS port (default 6379)")
    sh.add_argument("--token-file", default=None,
                    help="token file, generated (0600) when missing (default $RAY_AUTH_TOKEN_PATH or "
                         "~/.ray/auth_token)")
    sh.add_argument("--object-store-mb", type=int, default=DEFAULT_OBJECT_STORE_MB,
                    help=f"object store cap of A's node in MiB (default {DEFAULT_OBJECT_STORE_MB})")
    sh.add_argument("--num-cpus", type=int, default=None)
    sh.add_argument("--dashboard", action="store_true", help="run Ray's dashboard, on 127.0.0.1 only")
    sh.add_argument("--temp-dir", default=None, help=f"Ray temp dir of A's node (default {rn.DEFAULT_TEMP['a']})")
    sh.add_argument("--json", action="store_true", help="also print the result as one JSON line")
    sp = sub.add_parser("stop", help="stop A's Ray head (our processes only)")
    sp.add_argument("--temp-dir", default=None)
    st = sub.add_parser("status", help="nodes and roles of the cluster")
    st.add_argument("--address", default=None, help="the head (default: the one start-head started)")
    st.add_argument("--token-file", default=None)
    sub.add_parser("versions", help="A's versions as JSON")
    return ap


def _b_command(address: str, token: pathlib.Path) -> str:
    return (f"python -m remote_worker setup --head {address} --model-path /PATH/TO/MiniMax-H3 --iface <B's QSFP "
            f"interface> --token-file {shlex.quote(str(token))}")


def cmd_start_head(args) -> int:
    if not args.iface and not args.node_ip:
        return _die("start-head needs --iface (the interface whose address Ray binds to), or --node-ip")
    try:
        ip, iface = rn.pick_node_ip(args.iface, args.node_ip)
    except rn.NodeError as exc:
        return _die(f"start-head: {exc}\n  fix: pass --iface with the interface that holds A's cluster address "
                    "(`ip -br addr`)")
    why = rn.forbidden_node_ip(ip)
    if why:
        return _die(f"start-head: cannot bind Ray to {ip}: {why}.\n  fix: use the QSFP interface's address")
    address = f"{ip}:{args.port}"
    temp_dir = args.temp_dir or rn.DEFAULT_TEMP["a"]
    token_path, created = rn.ensure_token_file(args.token_file)
    token = rn.token_env(str(token_path))
    running = rn.node_processes(temp_dir)
    state = rn.read_state("a") or {}
    if running:
        if state.get("address") == address:
            print(f"A's Ray head already runs at {address} ({len(running)} processes); re-publishing A's versions")
            res = rn.publish_versions(address, token, rn.local_versions())
            if not res.get("ok"):
                return _die(f"start-head: the running head did not take A's versions: {res.get('message')}")
            _print_next(address, token_path, created=False, args=args)
            return 0
        return _die(f"start-head: Ray processes of ours already use {temp_dir} (head {state.get('address', '?')}): "
                    "run `python -m comfy_h3_nodes cluster stop` first")
    if rn.tcp_reachable(ip, args.port, timeout=1.0):
        return _die(f"start-head: something already listens on {address}\n  fix: stop it, or choose another --port")
    ray_args = ["--head", "--port", str(args.port), "--node-ip-address", ip,
                "--resources", json.dumps({"h3_role_a": 1000}),
                "--object-store-memory", str(args.object_store_mb * 2**20),
                "--system-config", json.dumps(rn.HEAD_SYSTEM_CONFIG)]
    if args.dashboard:
        ray_args += ["--include-dashboard", "true", "--dashboard-host", "127.0.0.1"]
    else:
        ray_args += ["--include-dashboard", "false"]
    if args.num_cpus is not None:
        ray_args += ["--num-cpus", str(args.num_cpus)]
    t0 = time.perf_counter()
    print(f"starting A's Ray head at {address} ({iface}), token auth with {token_path}"
          f"{' (generated, mode 0600)' if created else ''} ...", flush=True)
    log = pathlib.Path(temp_dir + "_start.log")
    rc, tail = rn.ray_start(ray_args, token, temp_dir, log)
    if rc != 0:
        n, left = rn.stop_node(temp_dir)
        return _die(f"start-head: `ray start --head` failed (exit {rc}); full output in {log}:\n{tail}\n"
                    f"(cleaned up {n} processes{'; left: ' + rn.describe(left) if left else ''})")
    res = {"ok": False}
    for _ in range(3):
        res = rn.publish_versions(address, token, rn.local_versions())
        if res.get("ok"):
            break
        time.sleep(1)
    if not res.get("ok"):
        print(f"warning: could not publish A's versions on the head ({res.get('message')}); B's preflight will need "
              "--expect-versions", file=sys.stderr)
    rn.write_state("a", {"address": address, "node_ip": ip, "iface": iface, "temp_dir": temp_dir,
                         "token_file": str(token_path), "started": time.time()})
    print(f"head up in {time.perf_counter() - t0:.1f} s", flush=True)
    _print_next(address, token_path, created, args)
    return 0


def _print_next(address: str, token_path: pathlib.Path, created: bool, args) -> None:
    print(f"\nRay head (machine A): {address}")
    print(f"token file: {token_path}{' (new)' if created else ''}; copy it to B, mode 0600, e.g.\n"
          f"  scp {token_path} B:{token_path} && ssh B chmod 600 {token_path}")
    print("On machine B run:\n  " + _b_command(address, token_path))
    print("Start ComfyUI on A with the token in its environment:\n"
          f"  RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token_path} python main.py\n"
          f"and enter cluster_address {address} in the H3RemoteDiT node.", flush=True)
    if args.json:
        print(json.dumps({"address": address, "token_file": str(token_path)}), flush=True)


def cmd_stop(args) -> int:
    state = rn.read_state("a") or {}
    temp_dir = args.temp_dir or state.get("temp_dir") or rn.DEFAULT_TEMP["a"]
    n, left = rn.stop_node(temp_dir)
    if left:
        return _die(f"cluster stop: {len(left)} Ray processes of A's node are still running: {rn.describe(left)}")
    rn.clear_state("a")
    print(f"stopped A's Ray head: {n} processes ended; no Ray process of this node (temp dir {temp_dir}) is left")
    return 0


def cmd_status(args) -> int:
    state = rn.read_state("a") or {}
    address = args.address or state.get("address")
    if not address:
        return _die("cluster status: no head started here (no state file) and no --address given")
    host, port = rn.split_address(address)
    if not rn.tcp_reachable(host, port, timeout=3.0):
        return _die(f"cluster status: nothing answers at {address}; start it with `cluster start-head`")
    info = rn.head_info(address, rn.token_env(args.token_file or state.get("token_file")), timeout=20)
    if not info.get("ok"):
        return _die(f"cluster status: {info.get('message')}")
    for n in info["nodes"]:
        roles = ",".join(r.removeprefix("h3_role_").upper() for r in n["roles"]) or "no role"
        print(f"{n['ip']:<16} {'alive' if n['alive'] else 'dead ':<6} role {roles}{'  (head)' if n['head'] else ''}")
    print("A's published versions: " + json.dumps(info.get("versions")))
    return 0


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.verb == "versions":
        print(json.dumps(rn.local_versions()))
        return 0
    return {"start-head": cmd_start_head, "stop": cmd_stop, "status": cmd_status}[args.verb](args)
