"""Ray cluster handling: the embedded two-node default, connecting by address, and topology validation.

Ray leaves an actor that asks for a missing role pending forever with no error, rewrites a 127.0.0.1 node address and
turns token authentication on by default for ``ray start``: this module exists so that none of that can hang us.

* Roles are custom node resources, ``h3_role_a`` and ``h3_role_b``; :func:`validate_topology` demands exactly one
  alive node per role, on distinct nodes, before anything is placed, and names every node it saw when it fails.
* :class:`EmbeddedCluster` starts a real two-node cluster on this machine (two raylets at 127.0.0.2 and 127.0.0.3,
  object stores capped) with ``ray.cluster_utils.Cluster``; it is loopback-only, so it runs without a token.
* :func:`connect` joins an existing cluster as a driver; any address that is not loopback requires token auth.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pathlib
import socket
import time
from dataclasses import dataclass, field

ROLE_A = "h3_role_a"
ROLE_B = "h3_role_b"
ROLE_UNITS = 1000.0  # a role node offers many units; each resident actor takes one
NAMESPACE = "comfy_h3"
DEFAULT_OBJECT_STORE_MB = int(os.environ.get("H3_OBJECT_STORE_MB", "512"))
A_IP, B_IP = "127.0.0.2", "127.0.0.3"


class ClusterError(RuntimeError):
    pass


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
    b: NodeInfo
    nodes: tuple[NodeInfo, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {"A": {"ip": self.a.ip, "node_id": self.a.node_id}, "B": {"ip": self.b.ip, "node_id": self.b.node_id},
                "nodes": [n.describe() for n in self.nodes]}


def list_nodes() -> list[NodeInfo]:
    import ray

    out = []
    for n in ray.nodes():
        res = n.get("Resources", {}) or {}
        roles = tuple(r for r in (ROLE_A, ROLE_B) if res.get(r, 0) > 0)
        out.append(NodeInfo(n["NodeID"], n.get("NodeManagerAddress", "?"), roles, bool(n.get("Alive"))))
    return out


def validate_topology(nodes: list[NodeInfo] | None = None) -> Topology:
    """Exactly one alive node per role, and distinct; otherwise a :class:`ClusterError` listing what was found."""
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
    if len(b) > 1:
        problems.append(f"{len(b)} nodes offer role B, expected one")
    if len(a) == 1 and len(b) == 1 and a[0].node_id == b[0].node_id:
        problems.append("roles A and B are on the same node; they must be two nodes (two machines)")
    if problems:
        raise ClusterError("cluster topology is wrong: " + "; ".join(problems) + f". Nodes found: {seen}.")
    return Topology(a[0], b[0], tuple(nodes))


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
    import sys

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
    import ray

    if ray.is_initialized():
        return
    t0 = time.monotonic()
    kwargs = {"address": address, "namespace": namespace, "log_to_driver": False}
    if node_ip:
        kwargs["_node_ip_address"] = node_ip
    ray.init(**kwargs)
    if time.monotonic() - t0 > timeout:
        raise ClusterError(f"joining Ray at {address} took {time.monotonic() - t0:.0f} s, over {timeout:.0f} s.")


@contextlib.contextmanager
def _ray_nodes_off_main_thread():
    """Let ``ray.cluster_utils`` start raylets from a thread that is not the main one (ComfyUI runs nodes on its
    prompt worker thread). Ray registers a SIGTERM handler for every node it starts, and ``signal.signal`` raises
    ``ValueError`` off the main thread. Skip only that registration, as ``ray.init`` itself does off the main thread;
    the atexit clean-up, the reaper process and the children's parent-death signal still take the raylets down with
    this process."""
    import threading

    if threading.current_thread() is threading.main_thread():
        yield
        return
    import ray._private.utils as ray_utils

    original = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original


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
        import ray
        from ray.cluster_utils import Cluster

        if ray.is_initialized():
            raise ClusterError("Ray is already initialised in this process; shut it down before starting a cluster.")
        store = self.object_store_mb * 2**20
        head_args = {"resources": {ROLE_A: ROLE_UNITS}, "node_ip_address": A_IP, "object_store_memory": store,
                     "num_cpus": self.num_cpus, "include_dashboard": False}
        if self.system_config:
            head_args["_system_config"] = self.system_config
        with _ray_nodes_off_main_thread():
            self._cluster = Cluster(initialize_head=True, head_node_args=head_args)
            self.b_node = self.add_b_node()
        ray.init(address=self._cluster.address, namespace=self.namespace, _node_ip_address=A_IP,
                 log_to_driver=False)
        return self

    def add_b_node(self):
        with _ray_nodes_off_main_thread():
            return self._add_b_node()

    def _add_b_node(self):
        node = self._cluster.add_node(resources={ROLE_B: ROLE_UNITS}, node_ip_address=B_IP,
                                      object_store_memory=self.object_store_mb * 2**20, num_cpus=self.num_cpus)
        self._cluster.wait_for_nodes()
        return node

    def kill_b_node(self) -> None:
        """Remove B's raylet (used by fault tests)."""
        self._cluster.remove_node(self.b_node, allow_graceful=False)
        self.b_node = None

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None
