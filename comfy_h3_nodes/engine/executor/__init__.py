"""The client of the two machines, in parts (see :mod:`.executor` for how they compose)."""

from .a_client import ActorA, Conditioning, LocalA
from .b_client import BClient, Denoised
from .batch import Batch, Outcome, decode_in_order
from .decode_plan import DecodePlan, DecodePlanner
from .executor import ActorClasses, H3Executor, use_actor_classes
from .pipeline import BatchProgress, GenerationResult, Job, Pipeline, Slots

__all__ = ["ActorA", "ActorClasses", "BClient", "Batch", "Outcome", "decode_in_order", "BatchProgress", "Conditioning", "DecodePlan", "DecodePlanner",
           "Denoised", "GenerationResult", "H3Executor", "Job", "LocalA", "Pipeline", "Slots", "use_actor_classes"]
