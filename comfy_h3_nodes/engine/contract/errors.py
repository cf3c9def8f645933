"""The errors a user or a caller can meet, each a sentence that names the machine, the stage, the value and the fix.

Shared by both machines: B raises :class:`DenoiseCancelled` and :class:`DecodeCancelled`, A recognises them by type
(Ray re-raises a remote exception as a subclass of its own class and of ``RayTaskError``).
"""

from __future__ import annotations


class H3Error(RuntimeError):
    """A failure of the distributed run; the message names the machine, the stage and the request."""


class H3Cancelled(H3Error):
    """A request that was cancelled (a user's interrupt, a batch stopped); both machines stopped it."""


class H3Timeout(H3Error):
    """A remote wait that ran past its bound (``Timeouts``)."""


class HandoffError(RuntimeError):
    """A hand-off that did not arrive: the message names the receiving machine, the stage and the request."""


class ModelFolderError(ValueError):
    """A checkpoint folder that cannot serve the request; the message names the folder and the component."""


class DenoiseCancelled(RuntimeError):
    """B stopped a request between two steps because its caller cancelled it."""


class DecodeCancelled(RuntimeError):
    """A decode (or a decode share) stopped between two clips because its request was cancelled."""
