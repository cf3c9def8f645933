#!/usr/bin/env python3
"""Two Sparks (and a LAN) on this machine: network namespaces with a Spark's links, cgroup CPUs and memory limits.

    python scripts/two_hosts.py up [--qsfp-rate 4gbit] [--mem h3b=3G ...]
    python scripts/two_hosts.py run HOST -- CMD...        # CMD in HOST's namespace, CPU and memory cgroup
    python scripts/two_hosts.py link HOST IFACE up|down   # pull / plug a cable
    python scripts/two_hosts.py mem HOST SIZE             # change a host's memory limit (e.g. 700M)
    python scripts/two_hosts.py status [--json]
    python scripts/two_hosts.py speed [--link qsfp|mgmt] [--mb 200]   # what tbf sustains, A -> B, bounded in time
    python scripts/two_hosts.py down                      # removes all it made, also after a killed run

Hosts ``h3a`` (ComfyUI, the head), ``h3b`` and ``h3b2`` (DiT machines) and ``h3lan`` (another machine on the LAN).
Each A/B host has the management link ``enP7s7`` (its default route, ``tbf`` 1 Gbit/s) on the bridge ``h3mgmt``,
shared by all four hosts, and a QSFP link (``enp1s0f0np0`` on A, ``enp1s0f1np1`` on B and B2: a port-1-to-port-2
cable) on the bridge ``h3qsfp`` (with B2 it is a QSFP switch; shaped with ``tbf`` to ``--qsfp-rate``). Both bridges
live in the namespace ``h3sw``, which has no address: the namespaces reach only each other, never the machine's
network (no route, no NAT; the runner enters them with ``ip netns exec``). Addresses come from 198.18.0.0/15
(RFC 2544's test range): management 198.18.0.0/24, QSFP 198.18.1.0/24. Each host runs on its own CPU (cpuset: A on
CPU 0, B on the last CPU, B2 and the LAN host share them when there are two) and under a memory limit (a memory
cgroup nested under this process's own). State is kept in /tmp/h3hosts/state.json; ``down`` works without it.

Stdlib only; needs root (one sentence says so otherwise). The pack never imports this; tests use its CLI.
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

HOSTS = ("h3a", "h3b", "h3b2", "h3lan")
SWITCH = "h3sw"  # the namespace holding both bridges
MGMT_BR, QSFP_BR = "h3mgmt", "h3qsfp"
MGMT_IF = "enP7s7"
QSFP_IF = {"h3a": "enp1s0f0np0", "h3b": "enp1s0f1np1", "h3b2": "enp1s0f1np1"}
MGMT_IP = {"h3a": "198.18.0.1", "h3b": "198.18.0.2", "h3b2": "198.18.0.3", "h3lan": "198.18.0.9"}
QSFP_IP = {"h3a": "198.18.1.1", "h3b": "198.18.1.2", "h3b2": "198.18.1.3"}
MGMT_RATE = "1gbit"
QSFP_RATE = "4gbit"  # what tbf sustains on this machine's veths is measured by `speed` (docs/two_spark_setup.md)
MEM = {"h3a": "8G", "h3b": "4G", "h3b2": "3G", "h3lan": "1G"}
STATE_DIR = pathlib.Path(os.environ.get("H3HOSTS_STATE", "/tmp/h3hosts"))
CG_NAME = "h3hosts"


class HarnessError(RuntimeError):
    pass


def sh(*cmd: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise HarnessError(f"`{' '.join(cmd)}` failed: {r.stderr.strip() or r.stdout.strip()}")
    return r


def need_root() -> None:
    if os.geteuid() != 0:
        raise HarnessError("two_hosts needs root: network namespaces, veth pairs, tc and cgroups are made as root "
                           "(run it with sudo, or as root in a container).")
    for tool in ("ip", "tc"):
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/sbin"]):
            raise HarnessError(f"two_hosts needs the `{tool}` command (iproute2), which is not installed.")


def netns_list() -> list[str]:
    r = sh("ip", "netns", "list", check=False)
    return [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


# ---------------------------------------------------------------------------------------------------------- cgroups
def _mounts() -> dict[str, str]:
    """controller (or 'unified') -> mount point, from /proc/self/mountinfo."""
    out: dict[str, str] = {}
    for ln in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = ln.partition(" - ")
        fields, rest = left.split(), right.split()
        if not rest:
            continue
        if rest[0] == "cgroup2":
            out.setdefault("unified", fields[4])
        elif rest[0] == "cgroup":
            for opt in rest[-1].split(","):
                if opt in ("cpuset", "memory"):
                    out[opt] = fields[4]
    return out


def _own_cgroup(controller: str) -> str:
    for ln in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = ln.split(":", 2)
        if (controller in ctrls.split(",")) or (controller == "unified" and ctrls == ""):
            return path
    return "/"


def cgroup_layout() -> dict:
    """Where each host's cpuset and memory cgroup go: v1 (separate cpuset and memory hierarchies) or v2."""
    m = _mounts()
    if "cpuset" in m and "memory" in m:
        own_mem = _own_cgroup("memory")
        return {"version": 1, "cpuset": os.path.join(m["cpuset"], _own_cgroup("cpuset").lstrip("/"), CG_NAME),
                "memory": os.path.join(m["memory"], own_mem.lstrip("/"), CG_NAME)}
    if "unified" in m:
        base = os.path.join(m["unified"], _own_cgroup("unified").lstrip("/"), CG_NAME)
        return {"version": 2, "cpuset": base, "memory": base}
    raise HarnessError("no cgroup cpuset/memory controller is mounted here (/proc/self/mountinfo)")


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def make_cgroups(layout: dict, cpus: dict[str, str], mem: dict[str, int]) -> None:
    if layout["version"] == 1:
        top = layout["cpuset"]
        os.makedirs(top, exist_ok=True)
        parent = os.path.dirname(top)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            _write(os.path.join(top, knob), pathlib.Path(parent, knob).read_text().strip())
        os.makedirs(layout["memory"], exist_ok=True)
        for h in HOSTS:
            d = os.path.join(top, h)
            os.makedirs(d, exist_ok=True)
            _write(os.path.join(d, "cpuset.cpus"), cpus[h])
            _write(os.path.join(d, "cpuset.mems"), pathlib.Path(top, "cpuset.mems").read_text().strip())
            d = os.path.join(layout["memory"], h)
            os.makedirs(d, exist_ok=True)
            _write(os.path.join(d, "memory.limit_in_bytes"), str(mem[h]))
    else:
        top = layout["memory"]
        os.makedirs(top, exist_ok=True)
        _write(os.path.join(top, "cgroup.subtree_control"), "+cpuset +memory")
        for h in HOSTS:
            d = os.path.join(top, h)
            os.makedirs(d, exist_ok=True)
            _write(os.path.join(d, "cpuset.cpus"), cpus[h])
            _write(os.path.join(d, "memory.max"), str(mem[h]))


def host_cgroups(layout: dict, host: str) -> list[str]:
    return sorted({os.path.join(layout["cpuset"], host), os.path.join(layout["memory"], host)})


def join_cgroups(layout: dict, host: str) -> None:
    for d in host_cgroups(layout, host):
        _write(os.path.join(d, "cgroup.procs"), str(os.getpid()))


def remove_cgroups(layout: dict | None) -> list[str]:
    left = []
    tops = {layout["cpuset"], layout["memory"]} if layout else set()
    try:
        tops |= set(cgroup_layout().values()) - {1, 2}
    except HarnessError:
        pass
    for top in sorted(t for t in tops if isinstance(t, str) and os.path.isdir(t)):
        for h in HOSTS:
            d = os.path.join(top, h)
            if not os.path.isdir(d):
                continue
            for _ in range(50):  # the processes killed below leave it within a moment
                pids = pathlib.Path(d, "cgroup.procs").read_text().split()
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                left.append(d)
        try:
            os.rmdir(top)
        except OSError:
            if os.path.isdir(top):
                left.append(top)
    return left


# ---------------------------------------------------------------------------------------------------------- network
def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def default_cpus() -> dict[str, str]:
    cpus = _cpus()
    first, last = str(cpus[0]), str(cpus[-1])
    return {"h3a": first, "h3b": last, "h3b2": last if len(cpus) < 3 else str(cpus[2]), "h3lan": first}


def _link(host: str, dev: str, br: str, ip: str, rate: str, peer: str) -> None:
    sh("ip", "-n", SWITCH, "link", "add", peer, "type", "veth", "peer", "name", dev, "netns", host)
    sh("ip", "-n", SWITCH, "link", "set", peer, "master", br, "up")
    sh("ip", "-n", host, "addr", "add", f"{ip}/24", "dev", dev)
    sh("ip", "-n", host, "link", "set", dev, "up")
    burst = "256kb" if rate == MGMT_RATE else "1mb"
    for ns, d in ((host, dev), (SWITCH, peer)):  # both directions: each host's egress and the switch port's
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", d, "root", "tbf", "rate", rate, "burst", burst,
           "latency", "50ms")


def up(qsfp_rate: str, mem: dict[str, int], cpus: dict[str, str]) -> dict:
    need_root()
    clash = [n for n in (SWITCH, *HOSTS) if n in netns_list()]
    if clash:
        raise HarnessError(f"namespaces {', '.join(clash)} exist already: run `python scripts/two_hosts.py down` "
                           "first")
    layout = cgroup_layout()
    state = {"hosts": list(HOSTS), "cgroups": layout, "qsfp_rate": qsfp_rate, "mgmt_rate": MGMT_RATE,
             "cpus": cpus, "mem": mem, "mgmt_if": MGMT_IF, "qsfp_if": QSFP_IF, "mgmt_ip": MGMT_IP,
             "qsfp_ip": QSFP_IP}
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    (STATE_DIR / "state.json").write_text(json.dumps(state, indent=1))
    try:
        for ns in (SWITCH, *HOSTS):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for br in (MGMT_BR, QSFP_BR):
            sh("ip", "-n", SWITCH, "link", "add", br, "type", "bridge")
            sh("ip", "-n", SWITCH, "link", "set", br, "up")
        for h in HOSTS:
            short = h[2:]
            _link(h, MGMT_IF, MGMT_BR, MGMT_IP[h], MGMT_RATE, f"{short}-mgmt")
            sh("ip", "-n", h, "route", "add", "default", "dev", MGMT_IF)  # the management link is the default route
            if h in QSFP_IF:
                _link(h, QSFP_IF[h], QSFP_BR, QSFP_IP[h], qsfp_rate, f"{short}-qsfp")
        make_cgroups(layout, cpus, mem)
    except BaseException:
        down(quiet=True)
        raise
    return state


def load_state() -> dict | None:
    try:
        return json.loads((STATE_DIR / "state.json").read_text())
    except (OSError, ValueError):
        return None


def down(quiet: bool = False) -> list[str]:
    need_root()
    state = load_state()
    for ns in (*HOSTS, SWITCH):
        if ns in netns_list():
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
    left = remove_cgroups(state["cgroups"] if state else None)
    for ns in (*HOSTS, SWITCH):
        if ns in netns_list():
            r = sh("ip", "netns", "del", ns, check=False)
            if r.returncode != 0:
                left.append(f"netns {ns}: {r.stderr.strip()}")
    try:
        (STATE_DIR / "state.json").unlink()
    except OSError:
        pass
    if not quiet:
        print("two_hosts: down" + (f"; could not remove: {', '.join(left)}" if left else ": nothing of ours is left"))
    return left


def require_up() -> dict:
    state = load_state()
    if not state or any(n not in netns_list() for n in (SWITCH, *HOSTS)):
        raise HarnessError("the hosts are not up: run `python scripts/two_hosts.py up` first")
    return state


def run(host: str, cmd: list[str]) -> None:
    need_root()
    state = require_up()
    if host not in HOSTS:
        raise HarnessError(f"no host {host!r}: the hosts are {', '.join(HOSTS)}")
    if not cmd:
        raise HarnessError("give the command after --, e.g. `run h3b -- ip -br addr`")
    join_cgroups(state["cgroups"], host)
    enter_netns(host)
    os.execvp(cmd[0], cmd)


def enter_netns(host: str) -> None:
    """This process into ``host``'s network namespace (setns), keeping the machine's mounts: unlike `ip netns exec`,
    which mounts a new /sys and so hides /sys/fs/cgroup, a host's processes see their cgroup (memory limit) as on a
    real machine. Inside a host, `ip` and /proc/net show its own interfaces (/sys/class/net still lists the
    machine's)."""
    import ctypes  # noqa: PLC0415 - only `run` needs it

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{host}", os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise HarnessError(f"setns into {host} failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def link(host: str, iface: str, updown: str) -> None:
    need_root()
    require_up()
    if updown not in ("up", "down"):
        raise HarnessError(f"link state {updown!r}: give up or down")
    sh("ip", "-n", host, "link", "set", iface, updown)


def set_mem(host: str, size: int) -> None:
    need_root()
    state = require_up()
    d = os.path.join(state["cgroups"]["memory"], host)
    _write(os.path.join(d, "memory.limit_in_bytes" if state["cgroups"]["version"] == 1 else "memory.max"), str(size))
    state["mem"][host] = size
    (STATE_DIR / "state.json").write_text(json.dumps(state, indent=1))


def counters(host: str) -> dict[str, dict[str, int]]:
    """Bytes and packets each interface of ``host`` sent and received (the kernel's counters)."""
    out = sh("ip", "-n", host, "-s", "-j", "link", "show").stdout
    res = {}
    for d in json.loads(out):
        st = d.get("stats64") or d.get("stats") or {}
        res[d["ifname"]] = {"rx_bytes": st.get("rx", {}).get("bytes", 0), "tx_bytes": st.get("tx", {}).get("bytes", 0),
                            "state": d.get("operstate", "?")}
    return res


def status() -> dict:
    need_root()
    state = load_state()
    present = [n for n in (SWITCH, *HOSTS) if n in netns_list()]
    res = {"up": bool(state) and len(present) == len(HOSTS) + 1, "namespaces": present, "hosts": {}}
    if not state:
        return res
    res.update(qsfp_rate=state["qsfp_rate"], mgmt_rate=state["mgmt_rate"])
    for h in HOSTS:
        if h not in present:
            continue
        pids = sh("ip", "netns", "pids", h, check=False).stdout.split()
        res["hosts"][h] = {"interfaces": counters(h), "pids": len(pids), "cpus": state["cpus"][h],
                           "mem_limit": state["mem"][h]}
    return res


SPEED_SERVER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5299)); s.listen(1)
s.settimeout(30); c, _ = s.accept(); c.settimeout(30); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    t0 = t0 or time.monotonic(); n += len(b)
print(n, time.monotonic() - t0)
"""
SPEED_CLIENT = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5299), timeout=10); buf = b"x" * (1 << 20)
end = time.monotonic() + float(sys.argv[3])
for _ in range(int(sys.argv[2])):
    if time.monotonic() > end: break
    c.sendall(buf)
c.close()
"""


def speed(which: str, mb: int, seconds: float = 20.0) -> dict:
    """Bytes per second TCP sustains A -> B over one link (bounded in size and time)."""
    state = require_up()
    dst = (state["qsfp_ip"] if which == "qsfp" else state["mgmt_ip"])["h3b"]
    me = [sys.executable, os.path.abspath(__file__), "run"]
    srv = subprocess.Popen([*me, "h3b", "--", sys.executable, "-c", SPEED_SERVER, dst], stdout=subprocess.PIPE,
                           text=True)
    time.sleep(1.0)
    subprocess.run([*me, "h3a", "--", sys.executable, "-c", SPEED_CLIENT, dst, str(mb), str(seconds)],
                   timeout=seconds + 20, check=True)
    out, _ = srv.communicate(timeout=40)
    n, dt = out.split()
    return {"link": which, "bytes": int(n), "seconds": round(float(dt), 3),
            "gbit_s": round(int(n) * 8 / float(dt) / 1e9, 3),
            "shaped_to": state["qsfp_rate"] if which == "qsfp" else state["mgmt_rate"]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd_tail: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd_tail = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="two_hosts", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    u = sub.add_parser("up")
    u.add_argument("--qsfp-rate", default=os.environ.get("H3HOSTS_QSFP_RATE", QSFP_RATE))
    u.add_argument("--mem", action="append", default=[], help="HOST=SIZE (e.g. h3b=3G)")
    u.add_argument("--cpus", action="append", default=[], help="HOST=CPULIST (e.g. h3b=1)")
    sub.add_parser("down")
    r = sub.add_parser("run")
    r.add_argument("host")
    lk = sub.add_parser("link")
    lk.add_argument("host")
    lk.add_argument("iface")
    lk.add_argument("state")
    mm = sub.add_parser("mem")
    mm.add_argument("host")
    mm.add_argument("size")
    st = sub.add_parser("status")
    st.add_argument("--json", action="store_true")
    sp = sub.add_parser("speed")
    sp.add_argument("--link", choices=("qsfp", "mgmt"), default="qsfp")
    sp.add_argument("--mb", type=int, default=200)
    a = p.parse_args(argv)
    try:
        if a.verb == "up":
            mem = {h: parse_size(v) for h, v in MEM.items()}
            mem.update({k: parse_size(v) for k, v in (x.split("=", 1) for x in a.mem)})
            cpus = default_cpus()
            cpus.update(dict(x.split("=", 1) for x in a.cpus))
            state = up(a.qsfp_rate, mem, cpus)
            print(f"two_hosts: up: {', '.join(HOSTS)}; management {MGMT_IF} 198.18.0.0/24 ({MGMT_RATE}), QSFP "
                  f"198.18.1.0/24 ({state['qsfp_rate']}); A {MGMT_IP['h3a']} / {QSFP_IP['h3a']} on "
                  f"{QSFP_IF['h3a']}, B {MGMT_IP['h3b']} / {QSFP_IP['h3b']} on {QSFP_IF['h3b']}, B2 "
                  f"{QSFP_IP['h3b2']}, LAN {MGMT_IP['h3lan']}; cgroups v{state['cgroups']['version']}")
        elif a.verb == "down":
            return 1 if down() else 0
        elif a.verb == "run":
            run(a.host, cmd_tail)
        elif a.verb == "link":
            link(a.host, a.iface, a.state)
        elif a.verb == "mem":
            set_mem(a.host, parse_size(a.size))
        elif a.verb == "status":
            s = status()
            if a.json:
                print(json.dumps(s))
            else:
                print(f"two_hosts: {'up' if s['up'] else 'down'} (namespaces: {', '.join(s['namespaces']) or 'none'})")
                for h, d in s["hosts"].items():
                    ifs = ", ".join(f"{k} {v['state']} rx {v['rx_bytes']} tx {v['tx_bytes']}"
                                    for k, v in d["interfaces"].items() if k != "lo")
                    print(f"  {h}: cpus {d['cpus']}, memory {d['mem_limit']} B, {d['pids']} processes; {ifs}")
        elif a.verb == "speed":
            print(json.dumps(speed(a.link, a.mb)))
    except HarnessError as exc:
        print(f"two_hosts: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
