"""Ray cluster handling: the embedded two-node default, connecting by address, and topology validation.

Ray leaves an actor that asks for a missing role pending forever with no error, rewrites a 127.0.0.1 node address and
turns token authentication on by default for ``ray start``: this module exists so that none of that can hang us.

* Roles are custom node resources, ``h3_role_a`` and ``h3_role_b``; :func:`validate_topology` demands exactly one
  alive A node and at least one alive B node (a pool of DiT workers may span several), none of them both, before
  anything is placed, and names every node it saw when it fails.
* :class:`EmbeddedCluster` starts a real two-node cluster on this machine (two raylets at 127.0.0.2 and 127.0.0.3,
  object stores capped) with ``ray.cluster_utils.Cluster``; it is loopback-only, so it runs without a token.
* :func:`connect` joins an existing cluster as a driver; any address that is not loopback requires token auth.
* When the process ends, its embedded clusters end with it at once and leave no process behind: an atexit hook
  (normal exit, Ctrl-C) and a SIGTERM hook (:func:`install_exit_hooks`, chained to the host's own handling) kill each
  cluster's whole process tree in milliseconds, where Ray's own exit hooks stop one process at a time (7-8 s here).
  Ray's SIGTERM handlers (which exit without calling the host's) and abseil's native stack trace on SIGTERM are
  taken out again after the cluster starts.
* Off the main thread, the cluster's processes are started from one daemon thread that lives as long as the process
  (:class:`_NodeStarter`): Linux sends Ray's parent-death signal when the starting *thread* ends.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import logging
import os
import pathlib
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil

ROLE_A = "h3_role_a"
ROLE_B = "h3_role_b"
ROLE_UNITS = 1000.0  # a role node offers many units; each resident actor takes one
#: what a resident actor asks of Ray beside its role unit: no CPU slot. Given a custom resource, Ray holds one CPU per
#: actor for its whole life, so a node with N CPUs leaves its N+1th worker pending, silently, until the start's bound
#: (900 s); memory, which the plans count, is the real limit. Torch threads are the actor's ``threads`` setting.
ACTOR_CPUS = 0
NAMESPACE = "comfy_h3"
DEFAULT_OBJECT_STORE_MB = int(os.environ.get("H3_OBJECT_STORE_MB", "512"))
A_IP, B_IP = "127.0.0.2", "127.0.0.3"


class ClusterError(RuntimeError):
    pass


def _ray():
    """Ray, imported on first use: it reads its auth settings at import (:func:`connect` sets them first), and
    ComfyUI loads the pack, this module included, without it."""
    import ray  # noqa: PLC0415 - see the docstring

    return ray


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    ip: str
    roles: tuple[str, ...]
    alive: bool

    def describe(self) -> str:
        roles = ",".join(r.removeprefix("h3_role_").upper() for r in self.roles) or "no role"
        return f"{self.ip} ({self.node_id[:8]}, {'alive' if self.alive else 'dead'}, role {roles})"


@dataclass(frozen=True)
class Topology:
    a: NodeInfo
    b: NodeInfo  # the first B node (the only one of a two-machine pair)
    nodes: tuple[NodeInfo, ...] = field(default_factory=tuple)
    bs: tuple[NodeInfo, ...] = ()  # every alive B node (a pool of DiT workers)

    def b_nodes(self) -> tuple[NodeInfo, ...]:
        return self.bs or (self.b,)

    def to_dict(self) -> dict:
        return {"A": {"ip": self.a.ip, "node_id": self.a.node_id}, "B": {"ip": self.b.ip, "node_id": self.b.node_id},
                "B_nodes": [{"ip": n.ip, "node_id": n.node_id} for n in self.b_nodes()],
                "nodes": [n.describe() for n in self.nodes]}


def list_nodes() -> list[NodeInfo]:
    ray = _ray()

    out = []
    for n in ray.nodes():
        res = n.get("Resources", {}) or {}
        roles = tuple(r for r in (ROLE_A, ROLE_B) if res.get(r, 0) > 0)
        out.append(NodeInfo(n["NodeID"], n.get("NodeManagerAddress", "?"), roles, bool(n.get("Alive"))))
    return out


def validate_topology(nodes: list[NodeInfo] | None = None) -> Topology:
    """Exactly one alive A node, one or more alive B nodes, none both; otherwise a :class:`ClusterError` listing
    what was found."""
    nodes = list_nodes() if nodes is None else nodes
    alive = [n for n in nodes if n.alive]
    a = [n for n in alive if ROLE_A in n.roles]
    b = [n for n in alive if ROLE_B in n.roles]
    seen = "; ".join(n.describe() for n in nodes) or "no nodes"
    problems = []
    if not a:
        problems.append(f"no alive node offers role A (resource {ROLE_A})")
    if not b:
        problems.append(
            f"no alive node offers role B (resource {ROLE_B}): start the DiT node with "
            "`python -m remote_worker setup` on machine B"
        )
    if len(a) > 1:
        problems.append(f"{len(a)} nodes offer role A, expected one")
    if len(a) == 1 and any(a[0].node_id == n.node_id for n in b):
        problems.append("roles A and B are on the same node; they must be two nodes (two machines)")
    if problems:
        raise ClusterError("cluster topology is wrong: " + "; ".join(problems) + f". Nodes found: {seen}.")
    b = sorted(b, key=lambda n: (n.ip, n.node_id))
    return Topology(a[0], b[0], tuple(nodes), tuple(b))


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_env(token_file: str | None = None) -> dict[str, str]:
    """The environment Ray needs for token auth; raises if no token is configured."""
    env = {"RAY_AUTH_MODE": "token"}
    if os.environ.get("RAY_AUTH_TOKEN"):
        env["RAY_AUTH_TOKEN"] = os.environ["RAY_AUTH_TOKEN"]
        return env
    path = token_file or os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if not pathlib.Path(path).is_file():
        raise ClusterError(
            f"no Ray auth token: set RAY_AUTH_TOKEN, or put the cluster's token in {path} (RAY_AUTH_TOKEN_PATH); "
            "`python -m comfy_h3_nodes cluster start-head` writes one."
        )
    env["RAY_AUTH_TOKEN_PATH"] = str(path)
    return env


def _tcp_reachable(address: str, timeout: float) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def connect(address: str, namespace: str = NAMESPACE, token_file: str | None = None, timeout: float = 15.0,
            node_ip: str | None = None) -> None:
    """Join the Ray cluster at ``host:port`` as a driver, with token auth unless the address is loopback."""
    if not _tcp_reachable(address, min(timeout, 5.0)):
        raise ClusterError(
            f"Ray head {address} is not reachable over TCP; start it (`python -m comfy_h3_nodes cluster start-head`) "
            "or fix the address and firewall."
        )
    if not is_loopback(address):
        env = token_env(token_file)
        if "ray" in sys.modules and os.environ.get("RAY_AUTH_MODE") != "token":
            raise ClusterError(
                "ray was imported before token auth was configured; set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH "
                "in the environment that starts ComfyUI."
            )
        os.environ.update(env)
    ray = _ray()

    if ray.is_initialized():
        return
    t0 = time.monotonic()
    kwargs = {"address": address, "namespace": namespace, "log_to_driver": False}
    if node_ip:
        kwargs["_node_ip_address"] = node_ip
    with _sigterm_kept():  # no native stack trace when the host is stopped with SIGTERM
        ray.init(**kwargs)
    if time.monotonic() - t0 > timeout:
        raise ClusterError(f"joining Ray at {address} took {time.monotonic() - t0:.0f} s, over {timeout:.0f} s.")


class _NodeStarter:
    """The one thread that starts every Ray process of this process's embedded clusters when the caller is not the
    main thread. Ray gives each process it starts the parent-death signal (``PR_SET_PDEATHSIG``: SIGKILL), and Linux
    sends it when the *thread* that started the process ends, not the process: a cluster started from a thread that
    then ended (a helper, a test's thread) lost its GCS and raylets at once, and the driver's GCS client ended the
    process 60 s later. This thread is a daemon that waits for work for as long as the process lives, so the cluster
    still dies with the process (its parent-death signal, and the exit hooks) and never with the caller's thread."""

    START_BOUND_S = 600.0  # a node start is bounded by Ray's own waits (tens of seconds); this only catches a wedge

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wedged: tuple[float, threading.Event] | None = None  # (since, done) of a start past its bound

    def run(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on the main thread as is, else on this thread; its result or its exception."""
        _free_thread_local_reformatters()
        if threading.current_thread() is threading.main_thread():
            return fn(*args, **kwargs)
        if self._wedged is not None and not self._wedged[1].is_set():  # every later start would wait behind it
            raise ClusterError(f"an earlier start of a Ray node in this process has not returned for "
                               f"{time.monotonic() - self._wedged[0]:.0f} s; restart ComfyUI (this process) and "
                               "see Ray's logs (/tmp/ray/session_latest/logs) for the process that did not start")
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="h3-ray-nodes", daemon=True)
                self._thread.start()
        done, box = threading.Event(), {}
        self._jobs.put((fn, args, kwargs, box, done))
        if not done.wait(self.START_BOUND_S):
            self._wedged = (time.monotonic() - self.START_BOUND_S, done)
            raise ClusterError(f"starting a Ray node of the embedded cluster took over {self.START_BOUND_S:.0f} s; "
                               "see Ray's logs (/tmp/ray/session_latest/logs) for the process that did not start")
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def _loop(self) -> None:
        while True:
            fn, args, kwargs, box, done = self._jobs.get()
            try:
                with _ray_nodes_off_main_thread():
                    box["result"] = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
                box["error"] = exc
            finally:
                done.set()


_node_starter = _NodeStarter()


def _free_thread_local_reformatters() -> None:
    """Free PyAV's per-thread video reformatters here, before Ray forks. PyAV 18.1.1 keeps one per thread
    (``av.video.frame._thread_local``), with swscale's worker threads. Ray starts each process with a Python
    ``preexec_fn``, so the forked child runs CPython's after-fork clean-up, which frees the other threads' thread-local
    data: a reformatter freed there waits forever for worker threads the child does not have, and Ray's start waits
    forever for that child (seen in CI: core's SaveVideo on ComfyUI's prompt thread, then the embedded cluster's
    first node). A new local object frees them all in this process, where the threads exist; PyAV makes a new one on
    its next use. Nothing is imported: a process without PyAV has none."""
    frame = sys.modules.get("av.video.frame")
    if frame is not None and isinstance(getattr(frame, "_thread_local", None), threading.local):
        frame._thread_local = threading.local()


@contextlib.contextmanager
def _ray_nodes_off_main_thread():
    """Let ``ray.cluster_utils`` start raylets from a thread that is not the main one (ComfyUI runs nodes on its
    prompt worker thread). Ray registers a SIGTERM handler for every node it starts, and ``signal.signal`` raises
    ``ValueError`` off the main thread. Skip only that registration, as ``ray.init`` itself does off the main thread;
    the atexit clean-up, the reaper process and the children's parent-death signal still take the raylets down with
    this process."""
    if threading.current_thread() is threading.main_thread():
        yield
        return
    import ray._private.utils as ray_utils  # noqa: PLC0415 - see _ray()

    original = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original


def _sigaction_get(signum: int):
    """The C-level action of ``signum`` as an opaque buffer (Linux), or None: Python's ``signal`` module neither sees
    nor restores a handler installed by native code."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(512)  # larger than struct sigaction on every Linux ABI
        return (libc, buf) if libc.sigaction(signum, None, buf) == 0 else None
    except (OSError, AttributeError):
        return None


class _NoSigtermNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


_NO_SIGTERM_NOTE = _NoSigtermNote()


@contextlib.contextmanager
def _sigterm_kept():
    """Give SIGTERM back its handling from before the block. Starting Ray nodes on the main thread installs handlers
    that exit without calling the host's, ``ray.init`` adds one more there, and on any thread it installs abseil's
    failure handler, which prints a native stack trace (``*** SIGTERM received ...``) before passing the signal on.
    What the process does on SIGTERM stays the host's, plus :func:`install_exit_hooks`."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    native = _sigaction_get(signal.SIGTERM)
    ray_log = logging.getLogger("ray._private.worker")
    ray_log.addFilter(_NO_SIGTERM_NOTE)  # off the main thread Ray says it set no handler: the host's stays, as here
    try:
        yield
    finally:
        ray_log.removeFilter(_NO_SIGTERM_NOTE)
        if native is not None:
            libc, buf = native
            libc.sigaction(signal.SIGTERM, buf, None)
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


_live: list["EmbeddedCluster"] = []  # started in this process and not shut down
_hooks_lock = threading.Lock()
_atexit_registered = False
_host_sigterm = None  # what SIGTERM did before install_exit_hooks


def shutdown_embedded_clusters(disconnect: bool = True) -> None:
    """Stop every embedded cluster of this process now (exit hooks): disconnect this driver, then kill each
    cluster's whole process tree at once."""
    for cluster in list(_live):
        try:
            cluster._stop_now(disconnect=disconnect)
        except Exception:  # noqa: BLE001 - an exit hook must never raise; what it could not stop is reported by Ray
            pass


def _on_exit() -> None:
    shutdown_embedded_clusters(disconnect=True)


def _on_sigterm(signum, frame):
    previous = _host_sigterm
    if previous is signal.SIG_IGN:
        return None
    if callable(previous):
        return previous(signum, frame)  # the host's own handling; if it exits normally the atexit hook runs
    # The default action ends the process without atexit: stop the clusters first, then end by SIGTERM as before.
    shutdown_embedded_clusters(disconnect=False)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    return None


def install_exit_hooks() -> bool:
    """Hook SIGTERM so that an embedded cluster of this process is stopped first, then SIGTERM does what it did
    before (the host's handler, or the default: the process ends by SIGTERM). Only the main thread can set a signal
    handler: ComfyUI imports the pack on its main thread but runs nodes (and so starts the cluster) on a worker
    thread, so the pack calls this at import. Harmless when no cluster runs; returns whether SIGTERM is hooked."""
    global _host_sigterm
    if threading.current_thread() is not threading.main_thread():
        return False
    with _hooks_lock:
        current = signal.getsignal(signal.SIGTERM)
        if current is _on_sigterm:
            return True
        if current is None:  # set by native code: not ours to chain
            return False
        _host_sigterm = current
        signal.signal(signal.SIGTERM, _on_sigterm)
        return True


def _track(cluster: "EmbeddedCluster") -> None:
    """Stop ``cluster`` when the process exits (its processes exist from here on, even if the start fails later)."""
    global _atexit_registered
    with _hooks_lock:
        if cluster not in _live:
            _live.append(cluster)
        if not _atexit_registered:  # registered after the Ray nodes' own exit hooks, so it runs before them
            atexit.register(_on_exit)
            _atexit_registered = True


def _untrack(cluster: "EmbeddedCluster") -> None:
    with _hooks_lock:
        if cluster in _live:
            _live.remove(cluster)


def _wait_dead(procs: list, timeout: float) -> None:
    """Until none of ``procs`` runs any more. A killed grandchild stays a zombie until init reaps it, which
    ``psutil.wait_procs`` waits for (about 1 s here); a zombie holds nothing."""
    deadline = time.monotonic() + timeout
    while procs and time.monotonic() < deadline:
        still = []
        for proc in procs:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    still.append(proc)
            except psutil.Error:
                pass
        procs = still
        if procs:
            time.sleep(0.01)


class EmbeddedCluster:
    """A real two-node Ray cluster on this machine: node A (the driver's) at 127.0.0.2, node B at 127.0.0.3."""

    def __init__(self, object_store_mb: int = DEFAULT_OBJECT_STORE_MB, num_cpus: int | None = None,
                 namespace: str = NAMESPACE, system_config: dict | None = None):
        self.object_store_mb = object_store_mb
        self.num_cpus = num_cpus or max(2, os.cpu_count() or 2)
        self.namespace = namespace
        self.system_config = system_config or {}
        self._cluster = None
        self.b_node = None

    @property
    def address(self) -> str:
        return self._cluster.address if self._cluster else ""

    def start(self) -> "EmbeddedCluster":
        ray = _ray()
        from ray.cluster_utils import Cluster  # noqa: PLC0415 - see _ray()

        if ray.is_initialized():
            raise ClusterError("Ray is already initialised in this process; shut it down before starting a cluster.")
        store = self.object_store_mb * 2**20
        head_args = {"resources": {ROLE_A: ROLE_UNITS}, "node_ip_address": A_IP, "object_store_memory": store,
                     "num_cpus": self.num_cpus, "include_dashboard": False}
        if self.system_config:
            head_args["_system_config"] = self.system_config
        with _sigterm_kept():
            self._cluster = _node_starter.run(Cluster, initialize_head=True, head_node_args=head_args)
            _track(self)
            self.b_node = self.add_b_node()
            ray.init(address=self._cluster.address, namespace=self.namespace, _node_ip_address=A_IP,
                     log_to_driver=False)
        install_exit_hooks()  # on the main thread; the pack's import did it for ComfyUI's worker thread
        return self

    def add_b_node(self, ip: str = B_IP, num_cpus: int | None = None):
        """A raylet with role B at ``ip`` (another DiT machine of a pool: 127.0.0.4, ...); returns Ray's node."""
        with _sigterm_kept():
            return _node_starter.run(self._add_b_node, ip, num_cpus)

    def _add_b_node(self, ip: str = B_IP, num_cpus: int | None = None):
        node = self._cluster.add_node(resources={ROLE_B: ROLE_UNITS}, node_ip_address=ip,
                                      object_store_memory=self.object_store_mb * 2**20,
                                      num_cpus=num_cpus or self.num_cpus)
        self._cluster.wait_for_nodes()
        return node

    def remove_node(self, node) -> None:
        """Remove a raylet this cluster added (a pool's extra B node), at once."""
        self._cluster.remove_node(node, allow_graceful=False)

    def kill_b_node(self) -> None:
        """Remove B's raylet (used by fault tests)."""
        self._cluster.remove_node(self.b_node, allow_graceful=False)
        self.b_node = None

    def shutdown(self) -> None:
        """Disconnect this driver and stop the cluster at once. Ray's own ``Cluster.shutdown`` stops the processes
        one by one with graceful waits: on a loaded machine the GCS could be gone for over 60 s while the rest still
        stopped, and a GCS client of this process then ended the process ("Failed to connect to GCS within 60
        seconds") before the caller got control back."""
        self._stop_now(disconnect=True)

    def _stop_now(self, disconnect: bool) -> None:
        """Kill the whole cluster at once (process exit): freeze the processes Ray started (raylets, GCS, monitors) so
        that none starts another, read their descendants (workers, actors, agents), SIGKILL all of them and reap
        them. Nothing of the cluster is needed any more, and one-by-one graceful stops take about 1 s per process."""
        _untrack(self)
        cluster, self._cluster, self.b_node = self._cluster, None, None
        if cluster is None:
            return
        if disconnect:
            ray = _ray()

            if ray.is_initialized():
                ray.shutdown()
        nodes = [n for n in (*cluster.worker_nodes, cluster.head_node) if n is not None]
        started = [info.process for n in nodes for infos in list(n.all_processes.values()) for info in infos]
        tree: dict[int, psutil.Process] = {}
        new = []
        for popen in started:
            if popen.poll() is None:
                try:
                    new.append(psutil.Process(popen.pid))
                except psutil.Error:
                    pass
        while new:  # freeze level by level until no process is left that could start one
            for proc in new:
                tree[proc.pid] = proc
                try:
                    proc.suspend()
                except psutil.Error:
                    pass
            found = []
            for proc in new:
                try:
                    found += [c for c in proc.children() if c.pid not in tree]
                except psutil.Error:
                    pass
            new = list({c.pid: c for c in found}.values())
        for proc in tree.values():
            try:
                proc.kill()
            except psutil.Error:
                pass
        started_pids = {p.pid for p in started}
        for popen in started:  # reap Ray's own children, so that its bookkeeping sees them gone
            try:
                popen.wait(timeout=5)
            except Exception:  # noqa: BLE001 - a process stuck in the kernel: Ray's exit hook reports it
                pass
        _wait_dead([p for pid, p in tree.items() if pid not in started_pids], timeout=5)
        for node in nodes:
            try:
                node.kill_all_processes(check_alive=False)  # all dead: only clears Ray's records
            except Exception:  # noqa: BLE001
                pass
        cluster.worker_nodes.clear()
        cluster.head_node = None
