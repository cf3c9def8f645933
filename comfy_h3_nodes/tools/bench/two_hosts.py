"""``bench two-hosts``: one whole request (encode, denoise, decode, MP4) on one host doing everything, against the pair
(A and B as separate hosts of ``scripts/two_hosts.py``: parallel A+B denoise, split decode, hand-offs over the shaped
QSFP link), each host on its own CPU.

Both sides run the user's path: the headless runner (the same node classes ComfyUI runs, A in the runner's process)
executing ``example_workflows/h3_t2va.json``. One host: the runner in ``h3a`` alone with ``cluster_address`` =
``local`` (its embedded two-node cluster on A's one CPU), ``parallel`` off, ``decode_on`` A. The pair: the docs'
commands, ``cluster start-head --iface enp1s0f0np0`` in ``h3a`` and ``remote_worker setup ... --iface enp1s0f1np1``
in ``h3b`` (the token copied), then the runner in ``h3a`` pointed at A's head with ``parallel`` = ``A+B`` and
``decode_on`` = ``A+B``. Each side runs one unmeasured request first (models resident, the DiT group formed, the
clip times measured), then the timed one; the bytes on every interface of A and B are read around the timed one.

The model is random (the real diffusers classes) and sized so that, on one host, denoise and decode stand in the
proportion of FastVideo's one-GB10 FastH3 at 832x480x124 (denoise 92 s, VAE 94 s): :data:`MODEL`. The harness is
driven only through its CLI (the pack never imports ``scripts/``); it needs root. The driver brings the hosts up
when they are not (and takes them down after), or uses the ones up already.

Last line with ``--json``: ``{"shape", "one_host_s", "pair_s", "ratio", "denoise_ratio", "decode_ratio",
"qsfp_share_of_bytes", "handoff_vs_wire"}``. Goals (reported, never asserted): ratio <= 0.65, qsfp share >= 0.95,
each hand-off <= 1.2 x its bytes over the QSFP rate ``two_hosts.py speed`` measures.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import select
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from diffusers import AutoencoderKLMiniMaxH3
from safetensors import safe_open

from ...engine.contract.versions import PACK_ROOT
from ...engine.model.tiny import build_tiny_checkpoint
from .. import runner
from .common import tiny_checkpoint

GOALS = {"ratio": 0.65, "qsfp_share_of_bytes": 0.95, "handoff_vs_wire": 1.2}
REAL = {"model": "FastVideo's FastH3 on one GB10 at 832x480x124", "denoise_s": 92.0, "decode_s": 94.0}
HARNESS = PACK_ROOT / "scripts" / "two_hosts.py"
WORKFLOW = PACK_ROOT / "example_workflows" / "h3_t2va.json"
A_QSFP, B_QSFP, A_IF, B_IF, MGMT_IF = "198.18.1.1", "198.18.1.2", "enp1s0f0np0", "enp1s0f1np1", "enP7s7"
PORT = 6379
HEAD = f"{A_QSFP}:{PORT}"

#: the random H3 of this bench, calibrated on one CPU so that denoise : decode is about 92 : 94 (printed with each run)
MODEL = {
    "transformer": dict(num_attention_heads=8, attention_head_dim=64, hidden_size=384, num_layers=2,
                        num_refiner_layers=1, ffn_dim=1024, text_dim=5120, freq_dim=32, time_embed_hidden_dim=64,
                        time_embed_dim=64, rope_freq_dim=8),
    # the real model's prompt_embeds width (Qwen3-VL 32B: 5120), so that A->B carries its real bytes per token
    "text_hidden": 5120,
    "vae": {"decoder_num_layers": 1, "decoder_num_attention_heads": 8, "decoder_attention_head_dim": 64,
            "decoder_ffn_mult": 4},
    "height": 384, "width": 640, "frames": 124, "steps": 4,
}
#: the timed request's prompt: 256 tokens (the tiny byte-level tokenizer gives one per byte, and with
#: ``text_hidden`` 5120 its ``prompt_embeds`` carry the real model's 10 KiB (bf16; 20 KiB here in fp32) per token, as
#: ../shared/design.md section 2 counts a real request)
PROMPT = ("a silver robot dances on a wooden table in a warm jazz club at night while an old man plays a slow tune on "
          "a grand piano; the camera circles the table, candle light flickers on the robot, people at the bar clap "
          "along and the piano's last chord rings out")
#: ``--quick``: the tiny checkpoint at a tiny canvas (a smoke run of every step, not a measurement)
QUICK = {"height": 64, "width": 64, "frames": 124, "steps": 3}


# ------------------------------------------------------------------------------------------------ the model
def checkpoint(model: dict = MODEL) -> pathlib.Path:
    """The bench's random checkpoint: the tiny one's components with :data:`MODEL`'s transformer and a larger random
    video VAE decoder (same encoder and latent statistics). Built once into the cache."""
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "comfy-h3"
    tag = "-".join(str(v) for part in ("transformer", "vae") for v in model[part].values()) + f"-{model['text_hidden']}"
    target = cache / f"bench-two-hosts-h3-{_digest(tag)}"
    if (target / ".complete").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=cache))
    build_tiny_checkpoint(tmp, seed=0, formats=False, transformer=model["transformer"], text_hidden=model["text_hidden"])
    config = {k: v for k, v in json.loads((tmp / "vae" / "config.json").read_text()).items() if not k.startswith("_")}
    config.update(model["vae"])
    torch.manual_seed(0)
    vae = AutoencoderKLMiniMaxH3(**config).eval()
    shutil.rmtree(tmp / "vae")
    vae.save_pretrained(str(tmp / "vae"))
    (tmp / "model.json").write_text(json.dumps(model, indent=1))
    (tmp / ".complete").write_text("ok\n")
    try:
        tmp.rename(target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def model_sizes(ckpt: pathlib.Path) -> dict:
    """Parameters of the transformer and of the video VAE's decoder (from the saved weights' headers)."""
    def count(folder: pathlib.Path, prefix: str = "") -> int:
        n = 0
        for f in folder.glob("*.safetensors"):
            with safe_open(str(f), "pt") as st:
                for k in st.keys():
                    if k.startswith(prefix):
                        shape = st.get_slice(k).get_shape()
                        size = 1
                        for d in shape:
                            size *= d
                        n += size
        return n

    return {"transformer_params": count(ckpt / "transformer"), "vae_decoder_params": count(ckpt / "vae", "decoder."),
            "vae_params": count(ckpt / "vae")}


# ------------------------------------------------------------------------------------------------ inside a host
def _sets(shape: dict, parallel: str, decode_on: str, seed: int, prompt: str) -> list[str]:
    return [f"3.width={shape['width']}", f"3.height={shape['height']}", f"3.num_frames={shape['frames']}",
            f"5.steps={shape['steps']}", f"5.seed={seed}", f"3.prompt={json.dumps(prompt)}", '1.dtype="float32"',
            '2.dtype="float32"', f'2.parallel="{parallel}"', f'6.decode_on="{decode_on}"']


def _request_facts(result, wall: float) -> dict:
    """What one timed request cost, from the runner's per-node timing payloads (every record of the request)."""
    recs = [r for p in result.timing_payloads().values() for r in p["stages"]]
    by = {}
    for r in recs:
        by.setdefault(r["stage"], []).append(r)

    def wall_of(stage: str, machine: str | None = None) -> float:
        rows = [r for r in by.get(stage, []) if machine is None or r["machine"] == machine]
        return max(r["end"] for r in rows) - min(r["start"] for r in rows) if rows else 0.0

    den = by.get("denoise", [])
    ranks = (den[0]["info"].get("ranks") if den else None) or []
    handoffs = []
    for stage in ("a_to_b", "b_to_a"):
        for r in by.get(stage, []):
            # a DiT group's latents come from its rank 0: when that rank is the receiver's own, nothing crossed
            local = stage == "b_to_a" and bool(ranks) and ranks[0].get("machine") == r["machine"]
            handoffs.append({"what": stage, "machine": r["machine"], "bytes": int(sum(r["bytes"].values())),
                             "seconds": r["fetch_s"] + r["materialize_s"], "crossed": not local})
    for r in by.get("decode", []):
        got = int(r["bytes"].get("b_frames", 0))
        if r["machine"] == "A" and got:
            handoffs.append({"what": "b_frames", "machine": "A", "bytes": got,
                             "seconds": r["fetch_s"] + r["materialize_s"], "crossed": True})
    dec_a = [r for r in by.get("decode", []) if r["machine"] == "A"]
    return {"wall_s": round(wall, 4), "seconds": round(result.seconds, 4),
            "encode_s": round(sum(r["compute_s"] for r in by.get("encode", [])), 4),
            "denoise_s": round(max((r["compute_s"] for r in den), default=0.0), 4),
            "denoise_wall_s": round(wall_of("denoise"), 4),
            "decode_s": round(wall_of("decode", "A"), 4),
            "decode_compute_s": round(sum(r["compute_s"] for r in dec_a), 4),
            "save_s": round(sum(r["compute_s"] for r in by.get("save", [])), 4),
            "handoffs": handoffs,
            "decode_note": next((r["note"] for r in dec_a), ""),
            # each side's share of the decode on its own clock: what a split lost against its clip shares
            "decode_records": [{k: r.get(k) for k in ("machine", "start", "end", "compute_s", "producer_wait_s",
                                                       "fetch_s", "materialize_s", "info")}
                               for r in by.get("decode", [])],
            "denoise_info": {k: v for k, v in (den[0]["info"] if den else {}).items()
                             if k in ("method", "rows", "ranks", "world")},
            "videos": [str(v) for v in result.videos()]}


def inner(argv: list[str]) -> int:
    """Run inside a host: one unmeasured request, ``READY``, wait for a line on stdin, the timed request, its facts
    as one JSON line. ``argv``: CKPT CLUSTER PARALLEL DECODE_ON SHAPE_JSON OUTPUT."""
    ckpt, cluster, parallel, decode_on, shape, output = argv[0], argv[1], argv[2], argv[3], json.loads(argv[4]), argv[5]
    run = dict(model_path=ckpt, cluster=cluster, output=output, quiet=True)
    try:
        t0 = time.perf_counter()
        warm = dict(shape, steps=2)  # models resident, the DiT group formed, the clip times measured: one forward is enough
        runner.execute(str(WORKFLOW), sets=_sets(warm, parallel, decode_on, 1, "warm-up: a piano in a hall"), **run)
        print(f"READY {time.perf_counter() - t0:.2f}", flush=True)
        if not sys.stdin.readline():
            return 3
        t0 = time.perf_counter()
        res = runner.execute(str(WORKFLOW), sets=_sets(shape, parallel, decode_on, 2, PROMPT), **run)
        facts = _request_facts(res, time.perf_counter() - t0)
        print(json.dumps(facts), flush=True)
        return 0
    finally:
        runner._shutdown_embedded()


# ------------------------------------------------------------------------------------------------ the driver
class Harness:
    """``scripts/two_hosts.py`` through its CLI."""

    def __init__(self, tmp: str, log):
        if not HARNESS.is_file():
            raise SystemExit(f"bench two-hosts needs the harness {HARNESS} (a checkout of the pack, not a wheel)")
        if os.geteuid() != 0:
            raise SystemExit("bench two-hosts needs root: scripts/two_hosts.py makes network namespaces and cgroups")
        self.tmp, self.log, self.brought_up = tmp, log, False

    def cli(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, str(HARNESS), *args], capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
        if check and out.returncode != 0:
            raise RuntimeError(f"two_hosts {' '.join(args)} failed ({out.returncode}): "
                               f"{(out.stdout + out.stderr)[-3000:]}")
        return out

    def ensure_up(self) -> None:
        st = json.loads(self.cli("status", "--json").stdout)
        if not st["up"]:
            if st["namespaces"]:
                self.cli("down")
            self.cli("up")
            self.brought_up = True

    def bytes(self) -> dict:
        st = json.loads(self.cli("status", "--json").stdout)
        return {h: {i: v["rx_bytes"] + v["tx_bytes"] for i, v in d["interfaces"].items()}
                for h, d in st["hosts"].items() if h in ("h3a", "h3b")}

    def env(self, side: str, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "VIRTUAL_ENV"}
        home = os.path.join(self.tmp, f"home_{side}")
        os.makedirs(home, exist_ok=True)
        env.update(PYTHONPATH=str(PACK_ROOT), H3_STATE_DIR=os.path.join(self.tmp, f"state_{side}"), HOME=home,
                   HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        env.update(extra)
        return env

    def run(self, host: str, args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, str(HARNESS), "run", host, "--", *args], capture_output=True,
                             text=True, timeout=timeout, env=env, cwd=str(PACK_ROOT), stdin=subprocess.DEVNULL)
        if out.returncode != 0:
            raise RuntimeError(f"in {host}: `{' '.join(args[:4])} ...` failed ({out.returncode}): "
                               f"{(out.stdout + out.stderr)[-3000:]}")
        return out

    def timed_request(self, host: str, args: list[str], env: dict, timeout: float) -> tuple[dict, dict, float]:
        """The inner runner in ``host``: its warm-up, then (interface counters read around it) the timed request."""
        log_path = os.path.join(self.tmp, f"inner_{int(time.time() * 1000)}.log")
        with open(log_path, "w") as err:
            p = subprocess.Popen([sys.executable, str(HARNESS), "run", host, "--", *args], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=str(PACK_ROOT))
        deadline = time.monotonic() + timeout
        try:
            line = _read_line(p, deadline, "READY")
            warm = float(line.split()[1])
            before = self.bytes()
            p.stdin.write("go\n")
            p.stdin.flush()
            facts = json.loads(_read_line(p, deadline, "{"))
            after = self.bytes()
            p.wait(timeout=max(5.0, deadline - time.monotonic()))
        except BaseException as exc:
            p.kill()
            p.wait(timeout=30)
            tail = pathlib.Path(log_path).read_text()[-4000:]
            raise RuntimeError(f"the runner in {host} did not finish its requests: {exc}\n{tail}") from None
        delta = {h: {i: after[h][i] - before[h].get(i, 0) for i in after[h]} for h in after}
        return facts, delta, warm


def _read_line(p: subprocess.Popen, deadline: float, starts: str) -> str:
    while time.monotonic() < deadline:
        ready, _, _ = select.select([p.stdout], [], [], min(5.0, max(0.1, deadline - time.monotonic())))
        if ready:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"it exited ({p.wait(timeout=30)}) before printing {starts!r}")
            if line.startswith(starts):
                return line.strip()
    raise TimeoutError(f"no {starts!r} line before the bench's bound")


def _inner_cmd(python: str, ckpt, cluster: str, parallel: str, decode_on: str, shape: dict, output: str) -> list[str]:
    return [python, "-m", "comfy_h3_nodes.tools.bench.two_hosts", str(ckpt), cluster, parallel, decode_on,
            json.dumps(shape), output]


def _worst_handoff(handoffs: list[dict], rate: float) -> tuple[float, list[dict]]:
    rows = []
    for h in handoffs:
        wire = h["bytes"] / rate if h["bytes"] and h["crossed"] else 0.0
        rows.append({**h, "wire_s": wire, "vs_wire": (h["seconds"] / wire) if wire > 0 else None})
    worst = max((r["vs_wire"] for r in rows if r["vs_wire"] is not None), default=float("nan"))
    return worst, rows


def run_two_hosts(quick: bool = False, log=print, timeout: float = 540.0) -> dict:
    """The bench: returns the issue's keys plus ``_detail`` (everything measured, popped before ``--json``)."""
    t_start = time.monotonic()
    python = sys.executable
    if quick:
        ckpt, shape = tiny_checkpoint(), dict(QUICK)
    else:
        ckpt, shape = checkpoint(), {k: MODEL[k] for k in ("height", "width", "frames", "steps")}
    sizes = model_sizes(ckpt)
    log(f"two-hosts: model {'tiny (quick: no calibration)' if quick else 'calibrated random H3'} {ckpt}: "
        f"transformer {sizes['transformer_params'] / 1e6:.2f} M parameters"
        + ("" if quick else f" ({MODEL['transformer']['num_layers']} blocks, {MODEL['transformer']['num_attention_heads']}"
           f" heads x {MODEL['transformer']['attention_head_dim']}, hidden {MODEL['transformer']['hidden_size']})")
        + f", video VAE decoder {sizes['vae_decoder_params'] / 1e6:.2f} M"
        + ("" if quick else f" ({MODEL['vae']['decoder_num_layers']} layers x "
           f"{MODEL['vae']['decoder_num_attention_heads'] * MODEL['vae']['decoder_attention_head_dim']}), text "
           f"encoder width {MODEL['text_hidden']}")
        + f"; {shape['width']}x{shape['height']}x{shape['frames']}, {shape['steps']} steps, fp32, a "
        f"{len(PROMPT.encode())}-byte prompt")
    tmp = tempfile.mkdtemp(prefix="h3bth_", dir="/tmp")  # short: Ray's socket paths stay < 108 characters
    hs = Harness(tmp, log)
    left = lambda: max(30.0, timeout - (time.monotonic() - t_start))  # noqa: E731
    env_a = hs.env("a", H3_PARALLEL_IFACE=A_IF)
    env_b = hs.env("b", H3_PARALLEL_IFACE=B_IF)
    store = "128" if quick else "768"
    try:
        hs.ensure_up()
        # 1. one host doing everything: the runner in h3a alone, its embedded cluster on A's one CPU
        one, one_bytes, one_warm = hs.timed_request(
            "h3a", _inner_cmd(python, ckpt, "local", "off", "A", shape, os.path.join(tmp, "out1")),
            hs.env("one"), left())
        log(f"two-hosts: one host (h3a alone, one CPU): warm-up {one_warm:.1f} s, request {one['seconds']:.2f} s "
            f"(encode {one['encode_s']:.2f}, denoise {one['denoise_s']:.2f}, decode {one['decode_s']:.2f}, MP4 "
            f"{one['save_s']:.2f}); denoise : decode = {one['denoise_s'] / max(one['decode_s'], 1e-9):.3f} "
            f"(the real model's 92 : 94 = {REAL['denoise_s'] / REAL['decode_s']:.3f})")
        # 2. the pair, by the docs' commands
        tok_a = os.path.join(env_a["HOME"], ".ray", "auth_token")
        tok_b = os.path.join(env_b["HOME"], ".ray", "auth_token")
        t0 = time.monotonic()
        hs.run("h3a", [python, "-m", "comfy_h3_nodes", "cluster", "start-head", "--iface", A_IF, "--port", str(PORT),
                       "--token-file", tok_a, "--object-store-mb", store, "--temp-dir", os.path.join(tmp, "ra"),
                       "--num-cpus", "2", "--json"], env_a, min(180.0, left()))
        os.makedirs(os.path.dirname(tok_b), mode=0o700, exist_ok=True)
        shutil.copy(tok_a, tok_b)
        os.chmod(tok_b, 0o600)
        hs.run("h3b", [python, "-m", "remote_worker", "setup", "--head", HEAD, "--model-path", str(ckpt), "--iface",
                       B_IF, "--token-file", tok_b, "--allow-cpu", "--object-store-mb", store, "--temp-dir",
                       os.path.join(tmp, "rb"), "--dtype", "float32", "--threads", "1", "--num-cpus", "2", "--json"],
               env_b, min(300.0, left()))
        setup_s = time.monotonic() - t0
        env_run = dict(env_a, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=tok_a)
        pair, pair_bytes, pair_warm = hs.timed_request(
            "h3a", _inner_cmd(python, ckpt, HEAD, "A+B", "A+B", shape, os.path.join(tmp, "out2")), env_run, left())
        speed = json.loads(hs.cli("speed", "--link", "qsfp", "--mb", "50" if quick else "200",
                                  timeout=60).stdout.strip().splitlines()[-1])
    finally:
        for host, args, env in (("h3b", ["remote_worker", "stop", "--temp-dir", os.path.join(tmp, "rb")], env_b),
                                ("h3a", ["comfy_h3_nodes", "cluster", "stop"], env_a)):
            try:  # what this bench started (a no-op where it did not get that far)
                subprocess.run([sys.executable, str(HARNESS), "run", host, "--", python, "-m", *args],
                               capture_output=True, timeout=90, env=env, cwd=str(PACK_ROOT), stdin=subprocess.DEVNULL)
            except Exception:  # noqa: BLE001 - the hosts' down below removes what is left
                pass
        if hs.brought_up:
            hs.cli("down", check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    rate = speed["bytes"] / speed["seconds"]
    qsfp = pair_bytes["h3a"].get(A_IF, 0) + pair_bytes["h3b"].get(B_IF, 0)
    total = sum(v for h in ("h3a", "h3b") for i, v in pair_bytes[h].items() if i != "lo")
    worst, rows = _worst_handoff(pair["handoffs"], rate)
    out = {"shape": {**shape, "model": "tiny" if quick else "calibrated", **sizes},
           "one_host_s": one["seconds"], "pair_s": pair["seconds"],
           "ratio": round(pair["seconds"] / one["seconds"], 4),
           "denoise_ratio": round(pair["denoise_s"] / max(one["denoise_s"], 1e-9), 4),
           "decode_ratio": round(pair["decode_s"] / max(one["decode_s"], 1e-9), 4),
           "qsfp_share_of_bytes": round(qsfp / total, 4) if total else 0.0,
           "handoff_vs_wire": round(worst, 3)}
    lines = [f"two-hosts: pair (A's head + B's setup {setup_s:.1f} s; warm-up {pair_warm:.1f} s): request "
             f"{pair['seconds']:.2f} s (encode {pair['encode_s']:.2f}, denoise {pair['denoise_s']:.2f}, decode "
             f"{pair['decode_s']:.2f}, MP4 {pair['save_s']:.2f}); denoise {pair['denoise_info']}; decode: "
             f"{pair['decode_note']}",
             f"  bytes during the pair's request: QSFP {qsfp:,} (A {pair_bytes['h3a'].get(A_IF, 0):,}, B "
             f"{pair_bytes['h3b'].get(B_IF, 0):,}), all of A's and B's interfaces but lo {total:,}: share "
             f"{out['qsfp_share_of_bytes']} (goal >= {GOALS['qsfp_share_of_bytes']}); one host's links carried "
             f"{sum(v for i, v in one_bytes['h3a'].items() if i != 'lo'):,} B",
             f"  QSFP link measured by `two_hosts.py speed`: {speed['gbit_s']} Gbit/s ({rate / 1e6:.0f} MB/s; "
             f"shaped to {speed['shaped_to']})"]
    for r in rows:
        lines.append(f"  hand-off {r['what']} (received on {r['machine']}): {r['bytes']:,} B in {r['seconds'] * 1e3:.1f}"
                     f" ms; " + (f"wire {r['wire_s'] * 1e3:.2f} ms: {r['vs_wire']:.2f} x" if r["vs_wire"] is not None else
                             "did not cross the link (the DiT group's rank 0 is on A)"))
    lines.append(f"  ratio {out['ratio']} (goal <= {GOALS['ratio']}; {'met' if out['ratio'] <= GOALS['ratio'] else 'NOT met'}),"
                 f" denoise ratio {out['denoise_ratio']}, decode ratio {out['decode_ratio']}, worst hand-off "
                 f"{out['handoff_vs_wire']} x wire (goal <= {GOALS['handoff_vs_wire']}); load average "
                 f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (shared: figures are noisy)")
    log("\n".join(lines))
    out["_detail"] = {"one_host": one, "pair": pair, "speed": speed, "handoffs": rows, "setup_s": round(setup_s, 2),
                      "bytes": {"one_host": one_bytes, "pair": pair_bytes}}
    return out


if __name__ == "__main__":
    sys.exit(inner(sys.argv[1:]))
