"""Machine B's preflight: one PASS/FAIL line per check, and the fix for every failure.

Nothing here starts Ray or changes the machine. The only network traffic is a TCP connect to A's Ray port and, when
that works and a token is present, one short GCS query (in a subprocess) that both proves the head accepts the token
and reads the versions A published at ``start-head``.

How B learns A's versions: ``python -m comfy_h3_nodes cluster start-head`` stores A's Python and package versions in
Ray's internal KV on the head (namespace ``comfy_h3``, key ``h3:a_versions``). ``--expect-versions FILE_OR_JSON``
overrides that (the JSON ``python -m comfy_h3_nodes cluster versions`` prints on A), for a head started otherwise.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pathlib
import re
import shutil
import socket
import sys
from dataclasses import dataclass, field

import psutil

from comfy_h3_nodes.cluster import ray_node as rn
from comfy_h3_nodes.engine.contract.configs import PARTITIONS, SCHEDULERS
from comfy_h3_nodes.engine.contract.errors import ModelFolderError
from comfy_h3_nodes.engine.model import formats
from comfy_h3_nodes.engine.model.backends import AttentionBackendError, resolve_attention_backend
from comfy_h3_nodes.engine.model.folders import check_model_dir

from . import model_roots

DEFAULT_OBJECT_STORE_MB = 2048
MIN_FREE_DISK = 2 * 2**30


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class Options:
    head: str
    model_path: str
    partition: str = "transformer"
    iface: str | None = None
    node_ip: str | None = None
    token_file: str | None = None
    allow_cpu: bool = False
    dtype: str = "bfloat16"
    attention_backend: str = "sdpa"
    object_store_mb: int = DEFAULT_OBJECT_STORE_MB
    temp_dir: str = rn.DEFAULT_TEMP["b"]
    model_roots: list[str] = field(default_factory=list)
    expect_versions: str | None = None
    head_timeout: float = 30.0
    precision: str = "auto"  # storage precision of the transformer (memory plan): auto | bf16 | fp8 | gguf
    residency: str = "auto"  # auto | both | one
    sources: dict = field(default_factory=dict)  # partition -> .safetensors / .gguf replacing <model>/<partition>/
    vsa_kernel: str | None = None  # FastH3 (VSA) checkpoints: auto | torch | triton | fastvideo (None: $H3_VSA_KERNEL)


@dataclass
class Result:
    checks: list[Check] = field(default_factory=list)
    node_ip: str | None = None
    iface: str | None = None
    model_dir: pathlib.Path | None = None
    a_versions: dict | None = None
    head_nodes: list | None = None
    reuse_node: bool = False
    sources: dict = field(default_factory=dict)  # partition -> formats.TransformerSource
    memory_plan: object = None  # the MemoryPlan B will load by

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str, fix: str = "") -> Check:
        c = Check(name, ok, detail, "" if ok else fix)
        self.checks.append(c)
        return c

    def render(self) -> str:
        width = max((len(c.name) for c in self.checks), default=10)
        lines = []
        for c in self.checks:
            lines.append(f"  {'PASS' if c.ok else 'FAIL'}  {c.name:<{width}}  {c.detail}")
            if not c.ok and c.fix:
                lines.append(f"  {'':4}  {'':<{width}}  fix: {c.fix}")
        failed = sum(not c.ok for c in self.checks)
        lines.append(f"preflight: {len(self.checks) - failed} passed, {failed} failed")
        return "\n".join(lines)


def dir_size(path: pathlib.Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path, followlinks=True):
        for f in files:
            try:
                total += (pathlib.Path(root) / f).stat().st_size
            except OSError:
                pass
    return total


def existing_parent(path: str) -> pathlib.Path:
    p = pathlib.Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def load_expected_versions(value: str) -> dict:
    """``--expect-versions``: a JSON file, or the JSON text itself."""
    text = value
    if not value.lstrip().startswith("{"):
        text = pathlib.Path(value).expanduser().read_text()
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object of name -> version")
    return {str(k): str(v) for k, v in data.items()}


# ---------------------------------------------------------------------------------------------------------- checks
def _check_network(opts: Options, res: Result) -> tuple[str | None, int | None]:
    try:
        host, port = rn.split_address(opts.head)
    except rn.NodeError as exc:
        res.add("head address", False, str(exc), "pass --head A_ADDRESS:PORT, as `cluster start-head` printed on A")
        return None, None
    try:
        ip, iface = rn.pick_node_ip(opts.iface, opts.node_ip, toward=host)
        why = rn.forbidden_node_ip(ip)
        if why:
            res.add("interface", False, f"node address {ip}: {why}",
                    "bind B to the address of its QSFP/cluster interface: --iface IF (see `ip -br addr`)")
        elif (wrong := wrong_link(opts, ip, iface)):
            res.add("interface", False, wrong[0], wrong[1])
        else:
            res.node_ip, res.iface = ip, iface
            res.add("interface", True, f"{iface} holds {ip}; Ray binds to it")
    except rn.NodeError as exc:
        fix = ("pass --iface with the interface that holds B's cluster address (`ip -br addr`); if the address was "
               "lost on reboot, re-add it (e.g. `sudo ip addr add 192.168.100.2/24 dev IF`) and make it persistent "
               "(netplan / NetworkManager)")
        if opts.node_ip and opts.iface:
            fix = f"use the address that {opts.iface} holds, or the interface that holds {opts.node_ip}; " + fix
        res.add("interface", False, str(exc), fix)
    if res.node_ip:
        src = rn.route_source(host)
        if src == res.node_ip:
            res.add("route to A", True, f"traffic to {host} leaves from {src} ({res.iface})")
        elif _loopback(host) and _loopback(res.node_ip):
            # both nodes on this machine (a trial: two raylets at 127.0.0.x): the kernel names 127.0.0.1 as the
            # source, but there is no other link to fall back to
            res.add("route to A", True, f"A {host} and B {res.node_ip} are both loopback addresses: one machine, "
                                        "no other link")
        else:
            res.add("route to A", False,
                    f"traffic to {host} would leave from {src or 'nowhere (no route)'} "
                    f"({rn.iface_of(src) if src else '-'}), not from {res.node_ip} on {res.iface}: it would fall "
                    "back to another link",
                    f"check `ip route get {host}`; give A's address on the same link as {res.iface}, or add a route "
                    f"to {host} via {res.iface}")
    if rn.tcp_reachable(host, port, timeout=3.0):
        res.add("head reachable", True, f"A's Ray port {host}:{port} answers")
        return host, port
    res.add("head reachable", False, f"nothing answers at {host}:{port} (A's Ray head)",
            f"start the head on A (`python -m comfy_h3_nodes cluster start-head --iface IF`), check the address and "
            f"port, and that no firewall blocks {port}/tcp from B")
    return None, None


VIRTUAL_LINKS = ("lo", "docker", "br-", "veth", "virbr", "cni", "flannel", "tailscale", "zt")


def default_route_iface() -> str | None:
    """The interface of the IPv4 default route (the management link on a Spark), from /proc/net/route."""
    try:
        for ln in pathlib.Path("/proc/net/route").read_text().splitlines()[1:]:
            f = ln.split()
            if len(f) > 7 and f[1] == "00000000" and f[7] == "00000000":
                return f[0]
    except OSError:
        pass
    return None


def machine_links() -> dict[str, list[str]]:
    """Physical-looking interfaces -> their routable IPv4 addresses (no loopback, no 169.254 link-local, no
    container bridges)."""
    out = {}
    for name, addrs in psutil.net_if_addrs().items():
        ips = [a.address for a in addrs if a.family == socket.AF_INET
               and not ipaddress.ip_address(a.address).is_link_local and not ipaddress.ip_address(a.address).is_loopback]
        if ips and not name.startswith(VIRTUAL_LINKS):
            out[name] = ips
    return out


def _qsfp_first(names: list[str]) -> list[str]:
    """ConnectX-7 QSFP ports are named like enp1s0f1np1 / enP2p1s0f0np0 (``np<port>``): those first."""
    return sorted(names, key=lambda n: (re.search(r"np\d+$", n) is None, n))


def wrong_link(opts: Options, ip: str, iface: str) -> tuple[str, str] | None:
    """``(one sentence, fix)`` when B's traffic would take the wrong link: a link-local-only interface, the
    management link (the default route) while a QSFP link has an address, or no --iface on a two-link machine."""
    links = machine_links()
    default = default_route_iface()
    others = _qsfp_first([n for n in links if n not in (iface, default)])
    instead = f"--iface {others[0]} (it holds {links[others[0]][0]})" if others else ""
    if ipaddress.ip_address(ip).is_link_local:
        return (f"{iface} holds only the link-local address {ip} (no address was configured on it, or it was lost on "
                f"reboot): A cannot route to it, so Ray's traffic would have no link; pass {instead or 'the QSFP link'} "
                "instead", f"give {iface} its cluster address (`sudo ip addr add 192.168.100.2/24 dev {iface}`), or pass "
                + (instead or "--iface with the interface that holds B's cluster address"))
    if opts.iface and iface == default and others:
        return (f"{iface} carries the default route (the management link): Ray, the hand-offs, gloo and the previews "
                f"would cross it, not the QSFP link; pass {instead} and A's address on that link as --head instead",
                f"pass {instead} (`ip -br addr`) and --head A_QSFP_ADDRESS:PORT")
    if not opts.iface and not opts.node_ip and len(links) >= 2:
        pick = _qsfp_first([n for n in links if n != default])[0] if len(links) > 1 else iface
        lead = "the management link (the default route)" if iface == default else "the route toward A"
        return (f"no --iface on a machine with {len(links)} links ({', '.join(f'{n} {v[0]}' for n, v in links.items())}): "
                f"Ray would bind to {iface} ({ip}, {lead}) while whatever guesses its address (gloo, NCCL, Ray's "
                f"own detection) takes {default or 'the default route'}; pass --iface {pick} instead",
                f"pass --iface {pick} (the QSFP link to A; `ip -br addr`)")
    return None


def _loopback(ip: str | None) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def _check_token_and_head(opts: Options, res: Result, reachable: bool) -> None:
    ok, detail, fix = rn.check_token_file(opts.token_file)
    res.add("token", ok, detail, fix)
    if not (ok and reachable):
        return
    info = rn.head_info(opts.head, rn.token_env(opts.token_file), timeout=opts.head_timeout)
    if not info.get("ok"):
        if info.get("error") == "auth":
            res.add("token accepted", False, f"the head at {opts.head} refused this token ({info['message'][:120]})",
                    f"copy the token file of machine A again (`scp A:~/.ray/auth_token "
                    f"{rn.token_path(opts.token_file)}`); both machines must hold the same token")
        else:
            res.add("token accepted", False, f"could not query the head at {opts.head}: {info.get('message')}",
                    "check that the head is a Ray 2.60 head started by `cluster start-head`")
        return
    res.add("token accepted", True, f"the head at {opts.head} accepted the token")
    res.head_nodes = info["nodes"]
    if info.get("versions") and res.a_versions is None:
        res.a_versions = info["versions"]
    ok, line, fix, res.reuse_node = roles_check(info["nodes"], res.node_ip)
    res.add("cluster roles", ok, line, fix)


def roles_check(nodes: list[dict], node_ip: str) -> tuple[bool, str, str, bool]:
    """Role A must be there; role B may already be held by other machines: a pool of DiT workers, each machine's
    actor pinned to its own node. Returns ``(ok, line, fix, this node already holds role B)``."""
    alive = [n for n in nodes if n["alive"]]
    a_nodes = [n["ip"] for n in alive if "h3_role_a" in n["roles"]]
    b_nodes = [n["ip"] for n in alive if "h3_role_b" in n["roles"]]
    others = [ip for ip in b_nodes if ip != node_ip]
    if not a_nodes:
        return (False, f"no alive node offers role A (nodes: {', '.join(n['ip'] for n in alive)})",
                "start A's head with `python -m comfy_h3_nodes cluster start-head`, which gives it role A", False)
    reuse = node_ip in b_nodes
    line = f"role A on {', '.join(a_nodes)}; role B " + ("already held by this node (re-using it)" if reuse
                                                         else "free for this node")
    if others:
        line += (f"; {', '.join(others)} also hold role B: this machine's DiT worker joins their pool (give it its "
                 "own --name)")
    return True, line, "", reuse


def _check_versions(opts: Options, res: Result) -> None:
    mine = rn.local_versions()
    source = "A (published by start-head)"
    if opts.expect_versions:
        try:
            res.a_versions = load_expected_versions(opts.expect_versions)
            source = "--expect-versions"
        except (OSError, ValueError) as exc:
            res.add("python", False, f"--expect-versions is unreadable: {type(exc).__name__}: {exc}",
                    "pass a JSON file or JSON text, as `python -m comfy_h3_nodes cluster versions` prints on A")
            return
    theirs = res.a_versions
    if theirs is None:
        fix = ("start A's head with `python -m comfy_h3_nodes cluster start-head` (it publishes A's versions), or "
               "pass --expect-versions with the JSON `python -m comfy_h3_nodes cluster versions` prints on A")
        res.add("python", False, f"A's versions are unknown (Python {mine['python']} here)", fix)
        res.add("packages", False, "A's versions are unknown", fix)
        return
    if "python" in theirs and theirs["python"] != mine["python"]:
        res.add("python", False, f"Python {mine['python']} here, {theirs['python']} on A ({source})",
                f"run B with Python {theirs['python']} (the same interpreter version as A), e.g. a venv made from "
                f"python{'.'.join(theirs['python'].split('.')[:2])}")
    else:
        res.add("python", True, f"Python {mine['python']}, same as {source}")
    diff = {k: v for k, v in rn.version_diff(mine, theirs).items() if k != "python"}
    if diff:
        desc = ", ".join(f"{k} {b} here vs {a} on A" for k, (a, b) in sorted(diff.items()))
        pins = " ".join(f"{k}=={a}" for k, (a, b) in sorted(diff.items()) if k not in ("wire_schema", "comfy-h3"))
        fix = (f"install A's versions on B (`pip install {pins}`)" if pins else "install the same versions") + \
            ("; check out the same comfy-h3 commit on both machines and `pip install -e .`"
             if {"comfy-h3", "wire_schema"} & set(diff) else "")
        res.add("packages", False, desc, fix)
    else:
        shown = ", ".join(f"{k} {v}" for k, v in mine.items() if k != "python")
        res.add("packages", True, f"{shown}; same as {source}")


def _check_torch(opts: Options, res: Result) -> object:
    try:
        import torch  # noqa: PLC0415 - a missing or broken torch is a failed check here, not a crash
    except Exception as exc:  # noqa: BLE001
        res.add("torch", False, f"import torch failed: {type(exc).__name__}: {exc}",
                "install torch for this machine (aarch64 + CUDA for a DGX Spark) into this Python")
        return None
    res.add("torch", True, f"torch {torch.__version__} (CUDA build {torch.version.cuda or 'none'})")
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        p = torch.cuda.get_device_properties(0)
        res.add("cuda", True, f"{n} GPU(s): {p.name} (sm_{p.major}{p.minor})")
    elif opts.allow_cpu:
        res.add("cuda", True, "no CUDA device; allowed by --allow-cpu (CPU trial: slow at real scale)")
    else:
        res.add("cuda", False, "torch sees no CUDA device" + ("" if torch.version.cuda else " (a CPU-only torch)"),
                "check `nvidia-smi`, install a CUDA build of torch for this GPU, or pass --allow-cpu for a CPU trial")
    return torch


def _check_memory(opts: Options, res: Result, torch, need: int | None) -> None:
    """The memory plan B's actor will check before loading (same residency rule), with the object store kept free."""
    from comfy_h3_nodes.engine.model import memory_plan as mp  # noqa: PLC0415 - imports torch: after its own check

    device = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    store = opts.object_store_mb * 2**20
    if opts.partition not in res.sources:
        res.add("memory plan", False, "no transformer source to plan for (see the checks above)",
                "fix the model folder / transformer file first")
        return
    try:
        avail, where = mp.available_memory(device)
        plan = mp.choose_b_plan(res.sources, opts.partition, opts.precision, opts.residency, opts.dtype, device,
                                mp.default_canvas(res.model_dir), limit_bytes=max(avail - store, 0))
    except (mp.MemoryPlanError, ModelFolderError) as exc:
        res.add("memory plan", False, str(exc), "choose a --precision that suits the files (see the message)")
        return
    plan.available_from = f"{where} minus the {rn.human_bytes(store)} object store"
    res.memory_plan = plan
    res.add("memory plan", plan.fits, plan.summary(),
            "pass one of the options that fit (--precision fp8, --residency one), stop other memory users on B, or "
            "lower --object-store-mb")


def _check_attention(opts: Options, res: Result) -> None:
    try:
        backend = resolve_attention_backend(opts.attention_backend)
    except AttentionBackendError as exc:
        res.add("attention", False, str(exc), "choose --attention-backend sdpa (always available), or install "
                "the backend's package for this torch/CUDA build")
        return
    try:
        import flash_attn  # noqa: F401,PLC0415 - optional (CUDA only): its real import error is reported

        fa = f"flash-attn {getattr(flash_attn, '__version__', '?')} importable"
    except Exception as exc:  # noqa: BLE001 - the real message is the point
        fa = f"flash-attn not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if backend == "native":
        res.add("attention", True, f"{opts.attention_backend}: torch scaled_dot_product_attention (SDPA); {fa}")
    else:
        res.add("attention", True, f"{opts.attention_backend} (diffusers backend {backend!r}); {fa}")


def _check_model(opts: Options, res: Result) -> int | None:
    need = None
    files = {k: v for k, v in (opts.sources or {}).items() if v}
    try:
        comps = ((opts.partition,) if opts.partition not in files else ()) + SCHEDULERS
        p = check_model_dir(opts.model_path, comps)
        res.model_dir = p
        sizes = {c: dir_size(p / c) for c in comps}
        res.add("model folder", True, f"{p}: " + ", ".join(f"{c} {rn.human_bytes(s)}" for c, s in sizes.items()))
    except ModelFolderError as exc:
        res.add("model folder", False, str(exc),
                f"point --model-path at the checkpoint folder that holds modular_model_index.json and the "
                f"{opts.partition}/, scheduler/ and audio_scheduler/ folders (copy them from the MiniMax-H3 "
                "diffusers checkpoint)")
    if res.model_dir is not None:
        for part in PARTITIONS:
            try:
                if part in files:
                    src = formats.detect(files[part], part, res.model_dir)
                elif (res.model_dir / part).is_dir():
                    src = formats.detect(res.model_dir, part)
                else:
                    continue
            except ModelFolderError as exc:
                res.add(f"{part} source", False, str(exc), "give a MiniMax-H3 transformer B can load (see above)")
                continue
            res.sources[part] = src
            if part == opts.partition:
                need = src.file_bytes
            res.add(f"{part} source", True, src.describe() + (f"; {src.vsa.describe()}" if src.vsa else ""))
        if opts.partition in res.sources and len(res.sources) == 1:
            other = "transformer_ref" if opts.partition == "transformer" else "transformer"
            res.add("swaps", True, f"no {other} source: requests needing it will fail")
    try:
        for path in (opts.model_path, *files.values()):
            resolved = model_roots.check_model_path(path, opts.model_roots, "model roots")
            env_roots = model_roots.parse_roots(os.environ.get(model_roots.ENV))
            model_roots.check_model_path(path, env_roots, f"model roots ({model_roots.ENV})")
        res.add("model roots", True, f"{resolved} is inside {', '.join(opts.model_roots) or '(no roots)'}"
                + (f" (and {len(files)} transformer file(s))" if files else ""))
    except model_roots.ModelRootError as exc:
        res.add("model roots", False, str(exc),
                "move the checkpoint under a model root, or add its parent with --model-root DIR")
    return need


def _check_vsa(opts: Options, res: Result, torch) -> None:
    """A FastH3 model's block-sparse kernel, resolved as B will (its real import error when it cannot load)."""
    tiles = {s.vsa.tile_size for s in res.sources.values() if s.vsa is not None}
    if not tiles or torch is None:
        return
    from comfy_h3_nodes.engine.model.vsa_kernels import resolve_vsa_kernel  # noqa: PLC0415 - needs torch (checked)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kernel = resolve_vsa_kernel(opts.vsa_kernel, device, tiles)
    except AttentionBackendError as exc:
        res.add("vsa kernel", False, str(exc), "install fastvideo-kernel for this torch/CUDA build, or pass "
                "--vsa-kernel torch")
        return
    res.add("vsa kernel", True, f"FastH3 VSA-H3 on {kernel.label}")


def _check_disk(opts: Options, res: Result) -> None:
    store = opts.object_store_mb * 2**20
    base = existing_parent(opts.temp_dir)
    free = shutil.disk_usage(base).free
    want = max(MIN_FREE_DISK, store)
    parts = [f"{rn.human_bytes(free)} free for Ray's logs and spilling at {base}"]
    ok = free >= want
    shm = pathlib.Path("/dev/shm")
    if shm.is_dir():
        shm_free = shutil.disk_usage(shm).free
        parts.append(f"/dev/shm {rn.human_bytes(shm_free)} free for the {rn.human_bytes(store)} object store")
        ok = ok and shm_free >= store
    res.add("disk", ok, "; ".join(parts),
            f"free space (want {rn.human_bytes(want)} at {base} and {rn.human_bytes(store)} in /dev/shm), choose "
            "another --temp-dir, or lower --object-store-mb")


def run(opts: Options) -> Result:
    """All checks, in the order printed."""
    res = Result()
    torch = _check_torch(opts, res)
    _check_attention(opts, res)
    need = _check_model(opts, res)
    _check_vsa(opts, res, torch)
    _check_memory(opts, res, torch, need)
    _check_disk(opts, res)
    host, _port = _check_network(opts, res)
    _check_token_and_head(opts, res, reachable=host is not None)
    _check_versions(opts, res)
    return res


def print_result(res: Result, stream=None) -> None:
    stream = stream or sys.stdout
    print("preflight of machine B (the DiT node):", file=stream)
    print(res.render(), file=stream, flush=True)
