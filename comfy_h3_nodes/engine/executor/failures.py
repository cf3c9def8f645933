"""What a remote failure becomes for the user: one sentence naming the machine, the stage and the request.

Ray wraps a remote exception in ``RayTaskError`` (and an actor's failed creation task in ``ActorDiedError`` whose
text carries ANSI colour codes and object reprs); :func:`remote_error` turns either into an
:class:`~..contract.errors.H3Error` whose message is the cause, never the wrapper.
"""

from __future__ import annotations

import re

import ray

from ..contract.errors import H3Cancelled, H3Error
from .handoff import unwrap_ray_error

#: what a caller sees when a worker's process or node is gone: died, unavailable (restarting, or its node not yet
#: judged), or unschedulable (a worker pinned to its node, and the node left the cluster)
WORKER_LOST = (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError,
               ray.exceptions.ActorUnschedulableError)

#: seconds to let the head judge B's node after B's actor became unavailable (node death shows ~1 s later)
NODE_SETTLE_S = 4.0

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REPR = re.compile(r"\s*\((?:pid=\d+[^)]*|repr=<[^>]*>)[^)]*\)")


class WorkerLost(Exception):
    """The worker denoising a request died or left the cluster (the request may run again on another)."""

    def __init__(self, exc: BaseException):
        super().__init__(str(exc))
        self.exc = exc


def clean(text: str) -> str:
    """A message without ANSI colour codes and without Ray's ``(pid=..., repr=<...>)`` decorations."""
    return _REPR.sub("", _ANSI.sub("", text)).strip()


def first_line(exc: BaseException) -> str:
    text = clean(str(exc)).splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def creation_cause(exc: BaseException) -> str:
    """The user's reason an actor failed to start: the exception its ``__init__`` raised (Ray keeps it as the
    error's cause, or prints it after the traceback), else the first line of Ray's own message."""
    inner = unwrap_ray_error(exc)
    cause = getattr(exc, "cause", None) or getattr(getattr(exc, "error", None), "cause", None)
    if isinstance(cause, BaseException):
        inner = unwrap_ray_error(cause)
    if inner is not exc:
        return clean(str(inner)).splitlines()[0] if str(inner).strip() else type(inner).__name__
    lines = [ln.strip() for ln in clean(str(exc)).splitlines() if ln.strip()]
    for ln in reversed(lines):  # Ray prints the creation task's traceback; its last line is "Type: message"
        m = re.match(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$", ln)
        if m and not m.group(1).startswith("ray."):
            return m.group(2)
    return lines[0] if lines else type(exc).__name__


def node_lost_error(machine: str, ip: str, stage: str, rid: str) -> H3Error:
    return H3Error(
        f"machine {machine} ({ip}) left the Ray cluster during {stage} of request {rid}: its node stopped answering "
        f"the head's health checks (machine {machine} down, its Ray node stopped, or the network link between A and "
        f"{machine} lost). Once {machine}'s node is back (`python -m remote_worker setup` on {machine}, or its "
        "service) the DiT actor is recreated there: run the request again."
    )


def remote_error(machine: str, stage: str, rid: str, exc: BaseException) -> H3Error:
    inner = unwrap_ray_error(exc)
    if type(inner).__name__ in ("DenoiseCancelled", "DecodeCancelled"):
        return H3Cancelled(str(inner))
    if isinstance(exc, WORKER_LOST):
        return H3Error(
            f"machine {machine}'s actor died during {stage} of request {rid} ({type(exc).__name__}); it is "
            "restarted automatically where its restart policy allows: run the request again."
        )
    if isinstance(inner, ValueError):  # validation errors keep their own clear sentence
        err = H3Error(f"{machine} refused request {rid} at {stage}: {clean(str(inner))}")
        err.__cause__ = inner
        return err
    return H3Error(f"{machine} failed during {stage} of request {rid}: {first_line(inner)}")


def collective_failure(exc: BaseException) -> bool:
    """Whether a group's collective broke because a peer vanished or froze (its sockets closed, or it timed out)."""
    text = str(exc)
    return any(s in text for s in ("Connection closed by peer", "Connection reset", "Timed out waiting",
                                   "timed out", "Broken pipe", "pair closure"))
