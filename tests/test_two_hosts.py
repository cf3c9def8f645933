"""A and B as separate hosts (scripts/two_hosts.py): a Spark's two links, cgroup CPUs and memory, the docs' commands.

``make test-two-hosts`` runs these (``make test`` leaves this file out). Needs root; the hosts are made for the module
and removed after it (``two_hosts.py down``). Every wait is bounded; traffic goes only to the namespaces' addresses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from two_hosts_support import (
    A_MGMT, A_QSFP, A_QSFP_IF, B_MGMT, B_QSFP, B_QSFP_IF, HARNESS, LAN_MGMT, MGMT_IF, harness, hosts,  # noqa: F401
)


def test_two_hosts_down_removes_everything_after_a_killed_run(tmp_path):
    """First (before the module's hosts are up): its own hosts: up, a process left running in h3b, the state file lost as after a kill -9;
    ``down`` still removes the namespaces, the cgroups and the process. Then ``up`` again for the tests after it."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    env = dict(os.environ, H3HOSTS_STATE=str(tmp_path / "state"))
    run = lambda *a, **k: subprocess.run([sys.executable, HARNESS, *a], capture_output=True, text=True,  # noqa: E731
                                         env=env, timeout=60, **k)
    had = "h3a" in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    if had:
        pytest.skip("the hosts are up (the module's fixture or by hand): run this test alone")
    assert run("up").returncode == 0
    sleeper = subprocess.Popen([sys.executable, HARNESS, "run", "h3b", "--", "sleep", "120"], env=env,
                               start_new_session=True)
    try:
        import time

        for _ in range(50):
            if subprocess.run(["ip", "netns", "pids", "h3b"], capture_output=True, text=True).stdout.strip():
                break
            time.sleep(0.1)
        (tmp_path / "state" / "state.json").unlink()
        out = run("down")
        assert out.returncode == 0 and "nothing of ours is left" in out.stdout, out.stdout + out.stderr
        assert sleeper.wait(timeout=10) != 0
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        assert not {"h3a", "h3b", "h3b2", "h3lan", "h3sw"} & set(names), names
        left = subprocess.run(["find", "/sys/fs/cgroup", "-maxdepth", "4", "-name", "h3hosts"], capture_output=True,
                              text=True, timeout=30).stdout.split()
        assert left == [], left
        out = run("run", "h3a", "--", "true")
        assert out.returncode == 2 and "not up" in out.stderr
    finally:
        sleeper.kill()
        run("down")


def test_two_hosts_says_in_one_sentence_when_not_root():
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, HARNESS,
                          "up"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().count("\n") == 0 and "needs root" in out.stderr, out.stderr


def test_two_hosts_have_a_sparks_links_and_their_own_cpu_and_memory(hosts):
    st = hosts.status()
    assert st["up"] and set(st["hosts"]) == {"h3a", "h3b", "h3b2", "h3lan"}
    assert set(st["hosts"]["h3a"]["interfaces"]) == {"lo", MGMT_IF, A_QSFP_IF}
    assert set(st["hosts"]["h3b"]["interfaces"]) == {"lo", MGMT_IF, B_QSFP_IF}
    assert set(st["hosts"]["h3lan"]["interfaces"]) == {"lo", MGMT_IF}
    out = hosts.run("h3b", ["ip", "route", "get", "8.8.8.8"])  # anything outside goes to the management link
    assert f"dev {MGMT_IF}" in out.stdout, out.stdout + out.stderr
    out = hosts.run("h3b", ["ip", "route", "get", A_QSFP])
    assert f"dev {B_QSFP_IF} src {B_QSFP}" in out.stdout, out.stdout
    # the switch namespace holds no address and no host has a route other than its two subnets and the default
    out = subprocess.run(["ip", "-n", "h3sw", "-4", "-br", "addr"], capture_output=True, text=True, timeout=10)
    assert [ln for ln in out.stdout.splitlines() if not ln.startswith("lo ")] == [], out.stdout
    probe = ("import os, pathlib; cg = pathlib.Path('/proc/self/cgroup').read_text(); "
             "print(sorted(os.sched_getaffinity(0)), [l for l in cg.splitlines() if 'h3hosts' in l])")
    a = hosts.run("h3a", [sys.executable, "-c", probe]).stdout
    b = hosts.run("h3b", [sys.executable, "-c", probe]).stdout
    cpus = sorted(os.sched_getaffinity(0))
    assert a.startswith(str([cpus[0]])) and b.startswith(str([cpus[-1]])), (a, b)
    assert "h3hosts/h3a" in a and "h3hosts/h3b" in b and "memory" in b, b


def test_two_hosts_reach_each_other_and_nothing_else(hosts):
    code = ("import socket, sys\nfor h in sys.argv[1:]:\n    s = socket.socket(); s.settimeout(2)\n"
            "    try: s.connect((h, 9)); r = 'open'\n    except ConnectionRefusedError: r = 'refused'\n"
            "    except OSError as e: r = type(e).__name__\n    print(h, r)\n")
    real = subprocess.run(["ip", "-4", "-br", "addr"], capture_output=True, text=True, timeout=10).stdout.split()
    outside = [w.split("/")[0] for w in real if w.count(".") == 3 and not w.startswith("127.")][:2]
    out = hosts.run("h3a", [sys.executable, "-c", code, B_QSFP, B_MGMT, LAN_MGMT, *outside], timeout=30).stdout
    seen = dict(ln.split() for ln in out.splitlines())
    assert seen[B_QSFP] == seen[B_MGMT] == seen[LAN_MGMT] == "refused", seen  # a host answers (no listener: RST)
    for ip in outside:  # the machine's own addresses are not reachable from a host
        assert seen[ip] != "refused" and seen[ip] != "open", seen


def test_two_hosts_links_are_shaped_and_the_qsfp_link_is_faster(hosts):
    q = json.loads(harness("speed", "--link", "qsfp", "--mb", "400", timeout=90).stdout)
    m = json.loads(harness("speed", "--link", "mgmt", "--mb", "120", timeout=90).stdout)
    print(f"\n[two hosts] tbf: QSFP shaped to {q['shaped_to']} sustains {q['gbit_s']} Gbit/s; management shaped to "
          f"{m['shaped_to']} sustains {m['gbit_s']} Gbit/s (2 shared cores: pessimistic)")
    assert m["gbit_s"] <= 1.05, m  # shaping holds the management link to 1 Gbit/s
    assert q["gbit_s"] > 1.5 * m["gbit_s"], (q, m)


def test_two_hosts_link_down_cuts_the_cable_and_up_restores_it(hosts):
    code = ("import socket, sys\ns = socket.socket(); s.settimeout(2)\ntry: s.connect((sys.argv[1], 9)); print('open')\n"
            "except ConnectionRefusedError: print('refused')\nexcept OSError as e: print(type(e).__name__)\n")
    hosts.link("h3b", B_QSFP_IF, "down")
    try:
        assert hosts.status()["hosts"]["h3b"]["interfaces"][B_QSFP_IF]["state"] == "DOWN"
        assert hosts.run("h3a", [sys.executable, "-c", code, B_QSFP]).stdout.strip() != "refused"
        assert hosts.run("h3a", [sys.executable, "-c", code, B_MGMT]).stdout.strip() == "refused"
    finally:
        hosts.link("h3b", B_QSFP_IF, "up")
    assert hosts.run("h3a", [sys.executable, "-c", code, B_QSFP]).stdout.strip() == "refused"


def _preflight(hosts, tiny_ckpt, *args: str) -> tuple[int, str]:
    from two_hosts_support import host_env

    out = hosts.run("h3b", [sys.executable, "-m", "remote_worker", "preflight", "--allow-cpu", "--head",
                            f"{A_QSFP}:6399", "--model-path", str(tiny_ckpt), "--dtype", "float32", *args],
                    env=host_env(hosts.tmp, "b"), timeout=120)
    line = next((ln.strip() for ln in out.stdout.splitlines() if ln.split()[1:2] == ["interface"]), "")
    return out.returncode, line + "\n" + out.stdout


@pytest.mark.parametrize("case", ["management", "no-iface", "link-local"])
def test_two_hosts_preflight_names_the_link_and_what_to_pass(hosts, tiny_ckpt, case):
    """B's setup on a two-link host: the management link, no --iface, or a link-local-only interface each fail in
    the preflight (nothing started) with one sentence naming the link the traffic would take and what to pass."""
    args = {"management": ["--iface", MGMT_IF], "no-iface": [], "link-local": ["--iface", "ll0"]}[case]
    if case == "link-local":  # a third port whose address never came (DHCP gave up: only 169.254.x)
        subprocess.run(["ip", "-n", "h3b", "link", "add", "ll0", "type", "veth", "peer", "name", "ll1"], check=True,
                       timeout=10)  # (no dummy module here: a veth pair inside h3b)
        subprocess.run(["ip", "-n", "h3b", "addr", "add", "169.254.7.2/16", "dev", "ll0"], check=True, timeout=10)
    try:
        rc, out = _preflight(hosts, tiny_ckpt, *args)
    finally:
        subprocess.run(["ip", "-n", "h3b", "link", "del", "ll0"], capture_output=True, timeout=10)
    line = out.splitlines()[0]
    print(f"\n[two hosts] preflight, {case}: {line}")
    assert rc != 0 and line.startswith("FAIL"), out
    assert f"--iface {B_QSFP_IF}" in line and line.count(". ") == 0, line  # one sentence, naming what to pass
    want = {"management": f"{MGMT_IF} carries the default route (the management link)",
            "no-iface": f"no --iface on a machine with 2 links ({MGMT_IF} {B_MGMT}, {B_QSFP_IF} {B_QSFP})",
            "link-local": "ll0 holds only the link-local address 169.254.7.2"}[case]
    assert want in line, line
    assert "preflight:" in out and "nothing was started" not in out.split("preflight:")[0]


def test_two_hosts_preflight_passes_the_interface_of_the_qsfp_link(hosts, tiny_ckpt):
    rc, out = _preflight(hosts, tiny_ckpt, "--iface", B_QSFP_IF)
    assert out.splitlines()[0].split() == ["PASS", "interface", B_QSFP_IF, "holds", f"{B_QSFP};", "Ray", "binds",
                                           "to", "it"], out
    assert any(ln.strip().startswith("PASS") and "route to A" in ln and B_QSFP_IF in ln for ln in out.splitlines()), out


def test_two_hosts_memory_plans_read_the_hosts_cgroup_limit(hosts):
    """A's and B's memory plans see their host's memory (its cgroup), not the machine's."""
    from two_hosts_support import host_env

    code = ("from comfy_h3_nodes.engine.model import memory_plan as mp; import json; "
            "print(json.dumps(mp.available_memory('cpu')))")
    figures = {}
    for h, limit in (("h3a", 8 * 2**30), ("h3b", 4 * 2**30)):
        out = hosts.run(h, [sys.executable, "-c", code], env=host_env(hosts.tmp, h), timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        avail, where = json.loads(out.stdout.strip().splitlines()[-1])
        figures[h] = (avail, where)
        assert avail <= limit and f"h3hosts/{h}" in where and "memory cgroup's limit" in where, (h, avail, where)
    print(f"\n[two hosts] memory plans: A sees {figures['h3a'][0] / 2**30:.2f} GiB, B {figures['h3b'][0] / 2**30:.2f} GiB "
          f"(cgroup limits 8 and 4 GiB; the machine has {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f})")


def test_two_hosts_a_model_over_bs_memory_limit_is_refused_before_loading(hosts, tiny_ckpt):
    """h3b2's limit lowered to 700 MiB: B's setup refuses in its memory plan, with the numbers, and starts nothing."""
    from two_hosts_support import host_env

    harness("mem", "h3b2", "700M")
    try:
        out = hosts.run("h3b2", [sys.executable, "-m", "remote_worker", "setup", "--allow-cpu", "--head",
                                 f"{A_QSFP}:6399", "--model-path", str(tiny_ckpt), "--dtype", "float32", "--iface",
                                 B_QSFP_IF, "--object-store-mb", "512", "--temp-dir",
                                 os.path.join(hosts.tmp, "rb2_mem")], env=host_env(hosts.tmp, "b2"), timeout=120)
    finally:
        harness("mem", "h3b2", "3G")
    line = next((ln.strip() for ln in out.stdout.splitlines() if ln.split()[1:3] == ["memory", "plan"]), "")
    print(f"\n[two hosts] B2 at 700 MiB: {line}")
    assert out.returncode != 0 and line.startswith("FAIL"), out.stdout[-3000:]
    assert "memory cgroup's limit (0.7 GiB" in line and "h3hosts/h3b2" in line and "512.0 MiB object store" in line, line
    assert "nothing was started" in out.stderr, out.stderr[-2000:]
    assert hosts.pids("h3b2") == []
