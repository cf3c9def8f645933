"""Is B's link down, or B's host gone? A's own probe while it waits on B, apart from Ray's health checks.

The head tolerates a silent B node for a long while (``ray_node.HEAD_SYSTEM_CONFIG``: a pulled cable or a rebooting
switch must not cost B its resident model), so A cannot wait for Ray to judge B's node. When B has not answered a
progress call for ``LINK_SILENT_S``, A opens a TCP connection to B's raylet: refused means B's processes are gone (a
host restarted, Ray stopped); no answer within ``PROBE_S`` means the link carries nothing. Either ends the request in
one sentence (:class:`LinkDown`; a pool moves the request to another worker first); a connection that opens means B
is only busy (the stall bound still applies).
"""

from __future__ import annotations

import os
import socket
import time

import ray

from ..contract.errors import H3Error

#: B silent this long (no progress answer) before A probes its node
LINK_SILENT_S = float(os.environ.get("H3_LINK_SILENT_S", "8"))
#: a TCP connect to B's raylet that takes longer counts as a link carrying nothing
PROBE_S = 2.0


class LinkDown(H3Error):
    """B cannot be reached (its link carries nothing, or its host refuses connections): the request stops in one
    sentence, and a pool hands it to another worker. ``short`` says which, for a re-run's note."""

    def __init__(self, message: str, short: str = "B cannot be reached"):
        super().__init__(message)  # one argument also works: errors are rebuilt by type(err)(longer sentence)
        self.short = short


def partition_tolerance_s() -> int:
    return int(float(os.environ.get("H3_PARTITION_TOLERANCE_S", "150")))


def node_address(node_id: str | None, node_ip: str) -> tuple[str, int] | None:
    """B's raylet (address, port) from the head's node table (on A: no traffic to B)."""
    try:
        for n in ray.nodes():
            if (node_id and n.get("NodeID") == node_id) or (not node_id and n.get("NodeManagerAddress") == node_ip):
                return n["NodeManagerAddress"], int(n["NodeManagerPort"])
    except Exception:  # noqa: BLE001 - no node table: no probe (the stall bound still applies)
        return None
    return None


def probe(address: tuple[str, int], timeout: float = PROBE_S) -> str:
    """``up``, ``refused`` (nothing listens: B's processes are gone) or ``silent`` (no answer: the link)."""
    try:
        with socket.create_connection(address, timeout=timeout):
            return "up"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "silent"


class LinkProbe:
    """Called by A's progress loop with the seconds since B last answered; raises the request's one sentence."""

    def __init__(self, node_id: str | None, node_ip: str, stage: str = "denoise"):
        self.node_id, self.node_ip, self.stage = node_id, node_ip, stage
        self.address: tuple[str, int] | None = None
        self.last = 0.0

    def due(self, silent_s: float) -> bool:
        return silent_s >= LINK_SILENT_S and time.monotonic() - self.last >= PROBE_S + 1.0

    def check(self, rid: str, silent_s: float) -> None:
        self.last = time.monotonic()
        self.address = self.address or node_address(self.node_id, self.node_ip)
        if self.address is None:
            return
        state = probe(self.address)
        if state == "silent":
            raise LinkDown(
                f"the link from A to machine B ({self.node_ip}) has carried nothing for {silent_s:.0f} s during "
                f"{self.stage} of request {rid} (QSFP cable pulled, port down or switch rebooting), so the request "
                f"was stopped; B keeps its model through up to {partition_tolerance_s()} s without a link: reconnect "
                "it and run the request again.", f"its link carried nothing for {silent_s:.0f} s")
        if state == "refused":
            raise self.lost_error(rid)

    def lost_error(self, rid: str) -> LinkDown:
        return LinkDown(
            f"machine B ({self.node_ip}) was lost during {self.stage} of request {rid}: its Ray node refuses "
            "connections (its processes are gone: the host restarted or Ray was stopped); start B again "
            "(`python -m remote_worker setup ...` on B, or its service) and run the request again.",
            "its host refused connections")

    def refused(self) -> bool:
        """B's node refuses connections (its processes are gone), as the head cannot tell for up to 150 s."""
        self.address = self.address or node_address(self.node_id, self.node_ip)
        return self.address is not None and probe(self.address) == "refused"
