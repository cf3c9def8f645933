"""``python -m remote_worker VERB``: machine B's command line (see docs/two_spark_setup.md).

Verbs:
  setup            preflight, join A's Ray cluster as the B node, start the resident DiT actor, warm it up, and print
                   the values for ComfyUI's H3RemoteDiT node
  preflight        only the checks of setup (changes nothing)
  status           the DiT actor's health, resident model, memory, uptime and recent requests
  release          "Release B's model": the DiT worker(s) drop their weights and keep their actors; the next request
                   reloads them (ComfyUI's /free never does this)
  stop             kill the DiT actor and stop this machine's Ray node (only ours; `--all` also runs `ray stop`)
  install-service  write a systemd unit (Restart=on-failure) that runs `setup --block`
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import asdict

from comfy_h3_nodes.cluster import ray_cluster as cl
from comfy_h3_nodes.cluster import ray_node as rn
from comfy_h3_nodes.engine.contract.configs import TINY, BConfig
from comfy_h3_nodes.engine.model import catalog

from . import model_roots, service
from . import preflight as pf

DEFAULT_SERVICE = "/etc/systemd/system/comfy-h3-dit.service"


def _ray():
    """Ray, imported only after :func:`main` put the cluster's token into the environment: Ray reads its auth mode
    once, at import, and a driver without the token fails only after about 20 s."""
    import ray  # noqa: PLC0415 - see the docstring

    return ray


def _die(msg: str, code: int = 1) -> int:
    print(msg, file=sys.stderr, flush=True)
    return code


# ---------------------------------------------------------------------------------------------------------- args
def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default="h3_dit",
                   help="name of the DiT actor (default h3_dit); each machine of a pool of DiT workers takes its own "
                        "(h3_dit_b2, h3_dit_b3, ...): A's H3RemoteDiT default h3_dit* uses every one of them")
    p.add_argument("--namespace", default="comfy_h3", help="Ray namespace of the actor (default comfy_h3)")
    p.add_argument("--token-file", default=None,
                   help="the cluster's Ray token (default $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)")
    p.add_argument("--temp-dir", default=None, help=f"Ray temp dir of this node (default {rn.DEFAULT_TEMP['b']})")


def _add_setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", required=True, help="A's Ray head, host:port (printed by `cluster start-head`)")
    p.add_argument("--model-path", required=True,
                   help="the MiniMax-H3 diffusers checkpoint folder on B, or 'tiny-random' (a tiny random model built "
                        "on B on first use: try the pair without weights)")
    p.add_argument("--iface", default=None, help="the interface B binds Ray to (the QSFP link to A)")
    p.add_argument("--node-ip", default=None, help="B's address (default: the interface's IPv4 address)")
    p.add_argument("--partition", default="transformer", choices=("transformer", "transformer_ref"))
    p.add_argument("--object-store-mb", type=int, default=pf.DEFAULT_OBJECT_STORE_MB,
                   help=f"object store cap of B's node in MiB (default {pf.DEFAULT_OBJECT_STORE_MB})")
    p.add_argument("--allow-cpu", action="store_true", help="let preflight pass without a GPU (trials)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp8", "gguf"),
                   help="storage precision of the transformer: auto (--dtype; GGUF as stored), bf16, fp8 (fp8 "
                        "storage, --dtype compute) or gguf")
    p.add_argument("--residency", default="auto", choices=("auto", "both", "one"),
                   help="keep both transformer partitions resident when the memory plan fits them (auto), require it "
                        "(both), or hold one and swap (one)")
    p.add_argument("--transformer-file", default=None, metavar="FILE",
                   help="the t2va/fl2va transformer as a published single-file .safetensors or an unpruned .gguf "
                        "(instead of <model-path>/transformer/)")
    p.add_argument("--transformer-ref-file", default=None, metavar="FILE",
                   help="the ref2va transformer as a .safetensors or .gguf (instead of <model-path>/transformer_ref/)")
    p.add_argument("--attention-backend", default="sdpa")
    p.add_argument("--vsa-kernel", default=None, choices=("auto", "torch", "triton", "fastvideo"),
                   help="FastH3 (VSA) checkpoints: the block-sparse kernel (default $H3_VSA_KERNEL, else auto: torch on "
                        "a CPU, fastvideo_kernel on CUDA)")
    p.add_argument("--device", default=None, help="torch device (default cuda when available)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of the actor (default torch's)")
    p.add_argument("--model-root", action="append", default=None, metavar="DIR",
                   help="a folder B may load models from (repeatable; default $H3_MODEL_ROOTS, else the parent of "
                        "--model-path)")
    p.add_argument("--expect-versions", default=None, metavar="FILE_OR_JSON",
                   help="A's versions (JSON of `cluster versions` on A), instead of those start-head published")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs B's node offers to Ray (default all)")
    p.add_argument("--start-timeout", type=float, default=1800.0,
                   help="seconds the actor may take to load its model (default 1800)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up denoise")
    p.add_argument("--replace", action="store_true",
                   help="replace a running DiT actor of this name that serves another model or partition")
    p.add_argument("--block", action="store_true",
                   help="stay in the foreground watching the node and actor; exit non-zero when either dies "
                        "(for systemd)")
    p.add_argument("--watch-s", type=float, default=15.0, help="--block: seconds between checks")
    p.add_argument("--json", action="store_true", help="print the H3RemoteDiT values as one JSON line at the end")
    _add_common(p)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m remote_worker", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True)
    _add_setup(sub.add_parser("setup", help="preflight, join A, start and warm up the DiT actor"))
    _add_setup(sub.add_parser("preflight", help="only the checks (changes nothing)"))
    st = sub.add_parser("status", help="health of the DiT actor")
    st.add_argument("--head", default=None, help="A's Ray head (default: the one setup joined)")
    st.add_argument("--node-ip", default=None)
    st.add_argument("--timeout", type=float, default=10.0)
    st.add_argument("--json", action="store_true")
    _add_common(st)
    rl = sub.add_parser("release", help="the DiT worker(s) drop their weights and keep their actors")
    rl.add_argument("--head", default=None, help="A's Ray head (default: the one setup joined)")
    rl.add_argument("--node-ip", default=None, help="this machine's cluster address (default: the one setup used)")
    rl.add_argument("--timeout", type=float, default=120.0,
                    help="seconds to wait for the workers (each releases after its running requests)")
    rl.add_argument("--json", action="store_true")
    _add_common(rl)
    sp = sub.add_parser("stop", help="kill the DiT actor and stop this machine's Ray node")
    sp.add_argument("--keep-actor", action="store_true", help="leave the actor registered (it waits for a B node)")
    sp.add_argument("--all", action="store_true",
                    help="also run `ray stop --force` (ends EVERY Ray process of this user on this machine)")
    _add_common(sp)
    sv = sub.add_parser("install-service", help="write a systemd unit that keeps B running")
    _add_setup(sv)
    sv.add_argument("--output", default=DEFAULT_SERVICE, help=f"unit file to write (default {DEFAULT_SERVICE})")
    sv.add_argument("--user", default=None, help="user the service runs as (default: the current user)")
    return ap


def model_roots_of(args) -> list[str]:
    if args.model_root:
        return [str(model_roots.real(r)) for r in args.model_root]
    env = model_roots.parse_roots(os.environ.get(model_roots.ENV))
    if env:
        return [str(model_roots.real(r)) for r in env]
    # default: the folder that holds the model (as given, so `root/../x` does not widen anything)
    given = pathlib.Path(os.path.abspath(os.path.expanduser(args.model_path)))
    return [str(model_roots.real(given.parent))]


def options_of(args) -> pf.Options:
    args.tiny = getattr(args, "tiny", False) or catalog.is_tiny(args.model_path)
    if args.tiny:  # the pack's tiny random model, built in this machine's cache: try B without weights
        args.tiny_name = catalog.tiny_name(args.model_path) if catalog.is_tiny(args.model_path) else TINY
        args.model_path = catalog.resolve(args.tiny_name)
    return pf.Options(head=args.head, model_path=args.model_path, partition=args.partition, iface=args.iface,
                      node_ip=args.node_ip, token_file=args.token_file, allow_cpu=args.allow_cpu, dtype=args.dtype,
                      attention_backend=args.attention_backend, object_store_mb=args.object_store_mb,
                      temp_dir=args.temp_dir or rn.DEFAULT_TEMP["b"], model_roots=model_roots_of(args),
                      expect_versions=args.expect_versions, precision=args.precision, residency=args.residency,
                      sources=_sources_of(args), vsa_kernel=getattr(args, "vsa_kernel", None))


def _sources_of(args) -> dict:
    """``--transformer-file`` / ``--transformer-ref-file`` as the actor's ``sources`` (absolute paths)."""
    files = {"transformer": args.transformer_file, "transformer_ref": args.transformer_ref_file}
    return {k: os.path.abspath(os.path.expanduser(v)) for k, v in files.items() if v}


# ---------------------------------------------------------------------------------------------------------- preflight
def cmd_preflight(args) -> int:
    res = pf.run(options_of(args))
    pf.print_result(res)
    return 0 if res.ok else 1


# ---------------------------------------------------------------------------------------------------------- setup
def _connect(head: str, namespace: str, token_file: str | None, node_ip: str) -> None:
    """Join as a driver on this node (token auth: ``main`` put the token into the environment before Ray loaded)."""
    cl.connect(head, namespace=namespace, token_file=str(rn.token_path(token_file)) if token_file else None,
               node_ip=node_ip, timeout=120.0)


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # the user's exception inside Ray's RayTaskError
    inner = cause if isinstance(cause, BaseException) else exc
    text = str(inner).strip()
    # a RayTaskError's text starts with its traceback; the last line holds the exception
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return f"{type(inner).__name__}: {lines[-1] if lines else ''}"


def _start_actor(args, model_dir: pathlib.Path, roots: list[str], node_ip: str):
    ray = _ray()
    from .actor import start_dit  # noqa: PLC0415 - imports Ray: only after main() set the token (see _ray)

    try:
        existing = ray.get_actor(args.name, namespace=args.namespace)
    except ValueError:
        existing = None
    if existing is not None:
        try:  # an actor whose node had died restarts on this node with its old config: wait for it to load
            ray.get(existing.ping.remote(), timeout=args.start_timeout)
            h = ray.get(existing.health.remote(), timeout=60)
        except Exception as exc:  # noqa: BLE001
            h = {"error": _first_line(exc)}
        same = (h.get("model_dir") == str(model_dir) and h.get("partition") == args.partition
                and h.get("dtype") == args.dtype and h.get("node_ip") == node_ip)
        if same:
            print(f"the DiT actor {args.name!r} already runs on {node_ip} with {model_dir} ({args.partition}): "
                  "re-using it", flush=True)
            return existing, h
        if h.get("reconfigures") and h.get("node_ip") == node_ip and not args.replace:  # A's nodes chose since
            print(f"the DiT actor {args.name!r} already runs on {node_ip}, reconfigured by A since it was set up (it "
                  f"serves {h.get('model')} now; {h.get('loads')} load(s) since it started, pid {h.get('pid')}): re-using "
                  "it, A's nodes choose what it serves (--replace starts it again with these settings)", flush=True)
            return existing, h
        desc = (f"{h.get('model_dir')} ({h.get('partition')}, {h.get('dtype')}) on {h.get('node_ip')}"
                if "error" not in h
                else f"an actor that does not answer ({h['error']})")
        if not args.replace:
            raise SystemExit(_die(
                f"a DiT actor named {args.name!r} already exists in namespace {args.namespace!r}: {desc}.\n"
                f"  fix: `python -m remote_worker stop` first, pass --replace, or choose another --name (each machine "
                "of a pool of DiT workers needs its own, e.g. h3_dit_b2)"))
        print(f"replacing the DiT actor {args.name!r} ({desc})", flush=True)
        ray.kill(existing, no_restart=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ray.get_actor(args.name, namespace=args.namespace)
                time.sleep(0.2)
            except ValueError:
                break
    cfg = asdict(BConfig(model_dir=_model_choice(args, model_dir), dtype=args.dtype, attention_backend=args.attention_backend,
                         device=args.device, threads=args.threads, partition=args.partition, name=args.name,
                         namespace=args.namespace, precision=args.precision, vsa_kernel=args.vsa_kernel))
    cfg["model_roots"] = list(roots)
    cfg["residency"], cfg["sources"] = args.residency, _sources_of(args)
    # pinned to this machine's node: with a pool, other nodes offer role B too
    actor = start_dit(cfg, node_id=ray.get_runtime_context().get_node_id(),
                      env={model_roots.ENV: os.pathsep.join(roots)})
    args.created_actor = actor  # a failed setup kills what it created (a detached actor would otherwise linger)
    t0 = time.perf_counter()
    source = cfg["sources"].get(args.partition) or model_dir  # --transformer-file: that file, not the folder
    print(f"starting the DiT actor {args.name!r} (loading {args.partition} from {source}) ...", flush=True)
    try:
        ip = ray.get(actor.ping.remote(), timeout=args.start_timeout)
    except ray.exceptions.GetTimeoutError:
        raise SystemExit(_die(f"the DiT actor did not come up within {args.start_timeout:.0f} s; see the Ray logs "
                              f"in {args.temp_dir or rn.DEFAULT_TEMP['b']}/session_latest/logs"))
    except ray.exceptions.RayError as exc:
        raise SystemExit(_die(f"the DiT actor failed to start on B: {_first_line(exc)}"))
    if ip != node_ip:
        raise SystemExit(_die(f"the DiT actor runs on {ip}, not on this node {node_ip}; is another node offering "
                              "role B? (`python -m comfy_h3_nodes cluster status` on A)"))
    h = ray.get(actor.health.remote(), timeout=60)
    print(f"DiT actor up in {time.perf_counter() - t0:.1f} s on {ip} ({h['device']}, {h['dtype']}, "
          f"attention {h['attention_backend']})", flush=True)
    plan = h.get("memory_plan") or {}
    if plan:
        measured = sum((plan.get("measured_bytes") or {}).values())
        print(f"memory: {plan['summary']}; B holds {rn.human_bytes(measured)} of weights", flush=True)
    return actor, h


def _model_choice(args, model_dir: pathlib.Path) -> str:
    """What the actor config and the node name: ``tiny-random`` stays that name (each machine builds its own)."""
    return getattr(args, "tiny_name", TINY) if getattr(args, "tiny", False) else str(model_dir)


def _print_values(args, head: str, model_dir: pathlib.Path, token_note: str) -> dict:
    values = {"cluster_address": head, "actor_name": args.name, "namespace": args.namespace,
              "model_path": _model_choice(args, model_dir), "partition": args.partition, "dtype": args.dtype,
              "attention_backend": args.attention_backend}
    print("\nB is ready. Enter these values in ComfyUI's \"H3 Remote DiT (B)\" node (H3RemoteDiT) on machine A:")
    for k, v in values.items():
        print(f"  {k:<18} {v}")
    print(f"Start ComfyUI on A with token auth: {token_note}")
    print("A pool: run setup on more machines, each with its own --name (h3_dit_b2, ...); actor_name h3_dit* on A "
          "(the node's default) uses every worker whose name starts with h3_dit.")
    print("Check B any time with `python -m remote_worker status`; stop it with `python -m remote_worker stop`.",
          flush=True)
    return values


def cmd_setup(args) -> int:
    opts = options_of(args)
    res = pf.run(opts)
    pf.print_result(res)
    if not res.ok:
        print("setup stopped: fix the failures above; nothing was started.", file=sys.stderr, flush=True)
        return 1
    node_ip, model_dir, roots = res.node_ip, res.model_dir, opts.model_roots
    temp_dir = opts.temp_dir
    token = rn.token_env(args.token_file)
    state = rn.read_state("b") or {}
    running = rn.node_processes(temp_dir)
    started_here = False
    if res.reuse_node and not running:
        return _die(f"a Ray node at {node_ip} already holds role B in the cluster, but it is not the one this command "
                    f"starts (no process of ours uses {temp_dir}).\n  fix: stop that node (`ray stop` on B, or "
                    "`python -m remote_worker stop --temp-dir ITS_TEMP_DIR`), then run setup again")
    if running:
        if state.get("head") == args.head and state.get("node_ip") == node_ip and res.reuse_node:
            print(f"B's Ray node is already running ({len(running)} processes, temp dir {temp_dir}): re-using it",
                  flush=True)
        else:
            return _die(f"Ray processes of ours already use {temp_dir} ({rn.describe(running)[:200]}) but are not "
                        f"joined to {args.head} as {node_ip}.\n  fix: `python -m remote_worker stop` first")
    else:
        ray_args = ["--address", args.head, "--node-ip-address", node_ip,
                    "--resources", json.dumps({"h3_role_b": 1000}),
                    "--object-store-memory", str(args.object_store_mb * 2**20)]
        if args.num_cpus is not None:
            ray_args += ["--num-cpus", str(args.num_cpus)]
        t0 = time.perf_counter()
        print(f"joining A's Ray cluster at {args.head} as {node_ip} (object store {args.object_store_mb} MiB) ...",
              flush=True)
        log = pathlib.Path(temp_dir + "_start.log")
        rc, tail = rn.ray_start(ray_args, {**token, model_roots.ENV: os.pathsep.join(roots)}, temp_dir, log)
        if rc != 0:
            n, left = rn.stop_node(temp_dir)
            return _die(f"`ray start` failed (exit {rc}); full output in {log}:\n{tail}\n"
                        f"(cleaned up {n} processes{'; left: ' + rn.describe(left) if left else ''})")
        started_here = True
        print(f"joined in {time.perf_counter() - t0:.1f} s", flush=True)
    rn.write_state("b", {"head": args.head, "node_ip": node_ip, "iface": res.iface, "temp_dir": temp_dir,
                         "token_file": str(rn.token_path(args.token_file)) if args.token_file else None,
                         "name": args.name, "namespace": args.namespace, "model_path": str(model_dir),
                         "partition": args.partition, "model_roots": roots, "started": time.time()})
    ray = _ray()
    try:
        _connect(args.head, args.namespace, args.token_file, node_ip)
        topo = cl.validate_topology()
        if node_ip not in {n.ip for n in topo.b_nodes()}:
            raise cl.ClusterError(f"the cluster's B node(s) are {', '.join(n.ip for n in topo.b_nodes())}, not this "
                                  f"node {node_ip}")
        actor, health = _start_actor(args, model_dir, roots, node_ip)
        if not args.no_warmup:
            from . import warmup  # noqa: PLC0415 - imports Ray and torch: only after main() set the token

            w = warmup.run(actor, args.partition, int(health["text_dim"]), args.dtype, timeout=args.start_timeout,
                           steps=(health.get("trained_steps") or {}).get(args.partition, 2),
                           canvases=warmup.canvases_for(health))
            print(f"warm-up: {w['workflow']} {w['steps']} step(s) in {w['seconds']:.2f} s "
                  f"(denoise {w['compute_s']:.2f} s, latents {w['latents']})", flush=True)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported in one sentence, then cleaned up
        if isinstance(exc, cl.ClusterError):
            _die(f"setup failed: {exc}")
        elif isinstance(exc, ray.exceptions.RayError):
            _die(f"setup failed: {_first_line(exc)}")
        elif not isinstance(exc, SystemExit):
            _die(f"setup failed: {type(exc).__name__}: {exc}")
        if ray.is_initialized():
            if getattr(args, "created_actor", None) is not None:
                try:
                    ray.kill(args.created_actor, no_restart=True)
                except Exception:  # noqa: BLE001 - it may never have started
                    pass
            ray.shutdown()
        if started_here:  # leave nothing of ours running after a failed setup
            n, left = rn.stop_node(temp_dir)
            rn.clear_state("b")
            print(f"stopped the Ray node this setup had started ({n} processes"
                  f"{'; still running: ' + rn.describe(left) if left else ''})", file=sys.stderr, flush=True)
        return int(exc.code or 1) if isinstance(exc, SystemExit) else 1
    token_note = "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=<A's token file, e.g. ~/.ray/auth_token> python main.py"
    values = _print_values(args, args.head, model_dir, token_note)
    if args.json:
        print(json.dumps({"h3_remote_dit": values, "node_ip": node_ip}), flush=True)
    if args.block:
        return _watch(args, actor, temp_dir)
    ray.shutdown()
    return 0


def _watch(args, actor, temp_dir: str) -> int:
    """``--block`` (the systemd service): watch the raylet and the actor every ``--watch-s``; exit 1 when either is
    gone (systemd restarts the service); SIGTERM or Ctrl-C stops B cleanly (actor, then node) and exits 0."""
    ray = _ray()

    stop = {"now": False}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.update(now=True))
    misses, next_check = 0, time.monotonic() + args.watch_s
    print(f"watching B every {args.watch_s:.0f} s; SIGTERM or Ctrl-C stops B (actor and node)", flush=True)
    while not stop["now"]:
        time.sleep(0.5)
        if time.monotonic() < next_check:
            continue
        next_check = time.monotonic() + args.watch_s
        if not any("raylet" in p.name() for p in rn.node_processes(temp_dir)):
            return _die("B's raylet is gone; exiting so that the service restarts")
        try:
            ray.get(actor.health.remote(), timeout=30)
            misses = 0
        except Exception as exc:  # noqa: BLE001
            misses += 1
            print(f"health check failed ({misses}/3): {_first_line(exc)}", file=sys.stderr, flush=True)
            if misses >= 3:
                return 1
    print("stopping B ...", flush=True)
    try:
        ray.kill(actor, no_restart=True)
    except Exception as exc:  # noqa: BLE001
        print(f"could not kill the DiT actor: {exc}", file=sys.stderr)
    ray.shutdown()
    n, left = rn.stop_node(temp_dir)
    if left:
        return _die(f"{len(left)} Ray processes of this node are still running: {rn.describe(left)}")
    rn.clear_state("b")
    print(f"stopped B: the DiT actor and {n} Ray processes", flush=True)
    return 0


# ---------------------------------------------------------------------------------------------------------- status
def _state_args(args) -> dict:
    st = rn.read_state("b") or {}
    return {"head": getattr(args, "head", None) or st.get("head"),
            "node_ip": getattr(args, "node_ip", None) or st.get("node_ip"),
            "temp_dir": args.temp_dir or st.get("temp_dir") or rn.DEFAULT_TEMP["b"],
            "token_file": args.token_file or st.get("token_file"), "state": st}


def cmd_status(args) -> int:
    s = _state_args(args)
    head, node_ip, temp_dir, token_file = s["head"], s["node_ip"], s["temp_dir"], s["token_file"]
    if not head:
        return _die(f"no B node set up here (no state file {rn.state_file('b')}) and no --head given: "
                    "run `python -m remote_worker setup`, or pass --head A:PORT")
    try:
        host, port = rn.split_address(head)
    except rn.NodeError as exc:
        return _die(str(exc))
    if not rn.tcp_reachable(host, port, timeout=3.0):
        return _die(f"status: A's Ray head {head} is not reachable (nothing answers on TCP {port}); the cluster is "
                    "down or the address is wrong. Start it on A with `python -m comfy_h3_nodes cluster start-head`, "
                    "then `python -m remote_worker setup` here.")
    info = rn.head_info(head, rn.token_env(token_file), timeout=min(30.0, args.timeout * 3))
    if not info.get("ok"):
        return _die(f"status: the head at {head} did not answer: {info.get('message')}")
    procs = rn.node_processes(temp_dir)
    raylet = any("raylet" in p.name() for p in procs)
    nodes = info["nodes"]
    mine = [n for n in nodes if n["alive"] and n["ip"] == node_ip]
    print(f"cluster {head}: " + "; ".join(f"{n['ip']} ({','.join(r[-1].upper() for r in n['roles']) or '-'}, "
                                           f"{'alive' if n['alive'] else 'dead'})" for n in nodes))
    print(f"this node {node_ip}: " + (f"{len(procs)} Ray processes, raylet {'up' if raylet else 'DOWN'}"
                                       if procs else "no Ray process of ours") +
          (", registered alive" if mine else ", not alive in the cluster"), flush=True)
    if not (raylet and mine):
        return _die("status: B's Ray node is not running; start it with `python -m remote_worker setup`")
    ray = _ray()

    name = args.name if args.name != "h3_dit" or not s["state"].get("name") else s["state"]["name"]
    namespace = (args.namespace if args.namespace != "comfy_h3" or not s["state"].get("namespace")
                 else s["state"]["namespace"])
    try:
        _connect(head, namespace, token_file, node_ip)
        try:
            actor = ray.get_actor(name, namespace=namespace)
        except ValueError:
            return _die(f"status: no DiT actor named {name!r} in namespace {namespace!r}; run "
                        "`python -m remote_worker setup`")
        h = ray.get(actor.health.remote(), timeout=args.timeout)
    except ray.exceptions.GetTimeoutError:
        return _die(f"status: the DiT actor {name!r} did not answer within {args.timeout:.0f} s")
    except ray.exceptions.RayError as exc:
        return _die(f"status: the DiT actor {name!r} is not healthy: {_first_line(exc)}")
    except Exception as exc:  # noqa: BLE001 - ClusterError and friends
        return _die(f"status: {type(exc).__name__}: {exc}")
    finally:
        if ray.is_initialized():
            ray.shutdown()
    if args.json:
        print(json.dumps(h, default=str))
        return 0
    mem = h.get("memory", {})
    print(f"DiT actor {name!r} (namespace {namespace}) on {h['node_ip']}: {'healthy' if h.get('ok') else 'NOT OK'}"
          f"{', busy' if h.get('busy') else ', idle'}")
    print(f"  model      {h['model_dir']} (partition {h['partition']}; resident "
          + ", ".join(f"{k}={v}" for k, v in h.get("resident", {}).items()) + ")")
    print(f"  runtime    {h['device']}, {h['dtype']}, attention {h['attention_backend']}, pid {h['pid']}")
    print("  memory     " + (", ".join(f"{k} {v}" for k, v in mem.items()) or "-"))
    held = h.get("resident_bytes") or {}
    print("  weights    " + (f"released ({h['released'].get('cause')}): the next request reloads them" if h.get("released")
                             else ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in held.items()) or "-"))
    print(f"  uptime     {h['uptime_s']:.0f} s, {h['loads']} load(s) since this worker (pid {h['pid']}) started"
          + (f", {h['reconfigures']} reconfigure(s)" if h.get("reconfigures") else ""))
    print("  versions   " + ", ".join(f"{k} {v}" for k, v in h.get("versions", {}).items()))
    recent = h.get("recent", [])
    print(f"  recent     {len(recent)} request(s)" + ("" if recent else " (none yet)"))
    now = time.time()
    for r in recent:
        print(f"    {r['request_id']}: {r['workflow']}, {r['steps']} steps, {r['compute_s']:.2f} s, "
              f"{now - r['finished']:.0f} s ago")
    return 0


# ---------------------------------------------------------------------------------------------------------- release
def cmd_release(args) -> int:
    """Every DiT worker matching ``--name`` (a name, a list, or a prefix with ``*``) drops its weights and keeps its
    actor; prints what each released."""
    s = _state_args(args)
    head, node_ip, token_file = s["head"], s["node_ip"], s["token_file"]
    if not head or not node_ip:
        return _die("release: no B node set up here (no state file) and no --head/--node-ip given: pass "
                    "--head A:PORT --node-ip THIS_MACHINE'S_CLUSTER_ADDRESS")
    name = args.name if args.name != "h3_dit" or not s["state"].get("name") else s["state"]["name"]
    namespace = (args.namespace if args.namespace != "comfy_h3" or not s["state"].get("namespace")
                 else s["state"]["namespace"])
    ray = _ray()
    from comfy_h3_nodes.engine.executor import pool  # noqa: PLC0415 - imports Ray: only after main() set the token

    try:
        _connect(head, namespace, token_file, node_ip)
        out = pool.release(name, namespace, args.timeout, cause="a release on request (remote_worker release)")
    except Exception as exc:  # noqa: BLE001 - one sentence
        return _die(f"release: {type(exc).__name__}: {exc}")
    finally:
        if ray.is_initialized():
            ray.shutdown()
    if args.json:
        print(json.dumps(out, default=str))
    else:
        for r in out["released"]:
            what = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in r["bytes"].items()) or "nothing"
            print(f"{r['name']}: {'was already released' if r.get('already') else 'released'} {what} "
                  f"(actor kept; the next request reloads it)")
        for n, why in out["missing"].items():
            print(f"{n}: not released: {why}", file=sys.stderr)
    return 0 if out["released"] and not out["missing"] else 1


# ---------------------------------------------------------------------------------------------------------- stop
def cmd_stop(args) -> int:
    s = _state_args(args)
    head, node_ip, temp_dir, token_file = s["head"], s["node_ip"], s["temp_dir"], s["token_file"]
    name = s["state"].get("name") if args.name == "h3_dit" and s["state"].get("name") else args.name
    namespace = (s["state"].get("namespace") if args.namespace == "comfy_h3" and s["state"].get("namespace")
                 else args.namespace)
    procs = rn.node_processes(temp_dir)
    raylet = any("raylet" in p.name() for p in procs)
    if not args.keep_actor and head and node_ip and raylet:
        host, port = rn.split_address(head)
        info = rn.head_info(head, rn.token_env(token_file), timeout=20) if rn.tcp_reachable(host, port) else {}
        if info.get("ok"):
            ray = _ray()

            try:
                _connect(head, namespace, token_file, node_ip)
                try:
                    ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
                    print(f"killed the DiT actor {name!r} (namespace {namespace})", flush=True)
                except ValueError:
                    print(f"no DiT actor named {name!r} in namespace {namespace!r}", flush=True)
            except Exception as exc:  # noqa: BLE001 - stopping the node matters more
                print(f"could not kill the DiT actor: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            finally:
                if ray.is_initialized():
                    ray.shutdown()
        else:
            print(f"the head {head} is not reachable ({info.get('message', 'no answer')}): the actor stays "
                  "registered until the cluster ends", file=sys.stderr, flush=True)
    n, left = rn.stop_node(temp_dir)
    if args.all:
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], timeout=120,
                       stdin=subprocess.DEVNULL)
    left = rn.node_processes(temp_dir)
    if left:
        return _die(f"stop: {len(left)} Ray processes of this node are still running: {rn.describe(left)}")
    rn.clear_state("b")
    print(f"stopped B's Ray node: {n} processes ended; no Ray process of this node (temp dir {temp_dir}) is left",
          flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.verb in ("setup", "status", "stop", "release") and "ray" not in sys.modules:
        # Ray reads the auth mode once, at import: the token must be in the environment before `import ray`
        token_file = args.token_file or (rn.read_state("b") or {}).get("token_file")
        if token_file:
            os.environ.pop("RAY_AUTH_TOKEN", None)
        os.environ.update(rn.token_env(token_file))
    verbs = {"setup": cmd_setup, "preflight": cmd_preflight, "status": cmd_status, "stop": cmd_stop,
             "release": cmd_release,
             "install-service": lambda a: service.cmd_install_service(a, parser())}
    try:
        return int(verbs[args.verb](args) or 0)
    except KeyboardInterrupt:
        return 130
