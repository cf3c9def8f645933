"""Which actors run where: the composition root above the engine and the B side.

The engine (:mod:`comfy_h3_nodes.engine`) defines the executor, the wire contract and the A side; the B side
(:mod:`remote_worker`) defines the DiT actor and depends on the engine's contract. Neither imports the other the
wrong way round: this module, which every tool that runs the pair imports (the nodes' connect, the runner, the
bench, the tests), hands the executor what it places:

* ``encoder`` (A's text encoder and VAEs, :func:`comfy_h3_nodes.engine.a_side.actor.encoder_actor_class`) on the A
  node,
* ``dit`` (the resident DiT, :func:`remote_worker.actor.start_dit`: the one factory of a DiT worker) on a B node.

Importing this module registers :data:`ACTORS` as the process default, so an executor built without ``actors=``
finds them.
"""

from __future__ import annotations

from remote_worker.actor import start_dit

from .engine.a_side.actor import encoder_actor_class
from .engine.executor import ActorClasses, use_actor_classes

ACTORS = use_actor_classes(ActorClasses(dit=start_dit, encoder=encoder_actor_class))


def actors() -> ActorClasses:
    """The actor classes of this process (registered on import)."""
    return use_actor_classes(ACTORS)
