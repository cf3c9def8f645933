"""The host without ComfyUI (the headless runner, tests, benchmarks): a tqdm progress bar, an interrupt flag set by
Ctrl-C, an in-memory event list (with optional listeners), a local output folder and model roots from
``H3_MODEL_DIRS``."""

from __future__ import annotations

import os
import pathlib
import threading
from typing import Callable

from tqdm import tqdm

from ..engine.contract.errors import H3Cancelled, H3Timeout


PACK_MODULES = ("comfy_h3_nodes", "remote_worker")


def builtin_error(exc: BaseException) -> BaseException:
    """``exc`` as a built-in exception with the same message when it is one of the pack's (or Ray's) types; others
    unchanged."""
    if type(exc).__module__.split(".")[0] not in (*PACK_MODULES, "ray"):
        return exc
    kind = (TimeoutError if isinstance(exc, (TimeoutError, H3Timeout)) else
            ValueError if isinstance(exc, ValueError) else RuntimeError)
    return kind(str(exc))


class ProgressReporter:
    def update(self, value: int, total: int, preview=None) -> None:  # pragma: no cover - interface
        """``value`` of ``total``; ``preview``: B's :class:`~..engine.contract.wire.Preview` when one came."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class LocalProgress(ProgressReporter):
    def __init__(self, total: int, desc: str, on_preview: Callable | None = None):
        self.bar = tqdm(total=total, desc=desc, leave=False, disable=os.environ.get("H3_QUIET") == "1")
        self.on_preview = on_preview

    def update(self, value: int, total: int, preview=None) -> None:
        if self.bar.total != total:
            self.bar.total = total
        self.bar.n = value
        self.bar.refresh()
        if preview is not None and self.on_preview is not None:
            self.on_preview(value, total, preview)

    def close(self) -> None:
        self.bar.close()


class LocalHost:
    """Host used without ComfyUI."""

    name = "local"

    def __init__(self):
        self.events: list[tuple[str, dict]] = []
        self.listeners: list[Callable[[str, dict], None]] = []
        self.interrupt_flag = threading.Event()
        self.current_prompt: str | None = None
        self._output = pathlib.Path(os.environ.get("H3_OUTPUT_DIR", "output")).resolve()
        #: without ComfyUI: previews only when asked for (``H3_PREVIEW=latent2rgb``) and given factors
        self.preview = os.environ.get("H3_PREVIEW", "none")
        self.factors: tuple[list, list, str] | None = None
        #: ``(decode, source)`` for the ``taesd`` method: ``decode(latent [C, h, w] float16) -> (jpeg, width,
        #: height)``; none without ComfyUI (a caller may set one)
        self.decoder: tuple[Callable, str] | None = None

    def hold_a_side(self, side, components) -> list:
        """Before the A side runs: what of ``components`` was released is loaded again (no host accounts for it
        here); returns the reload records."""
        return list(side.ensure(tuple(components)))

    def hold_a_rank(self, rank, held_bytes: int, device: str) -> None:
        """No host frees memory here: A's DiT rank stays until ``H3RemoteDiT.parallel`` is off or it is released."""

    def held_elsewhere(self, device: str | None = None) -> dict:
        """Nothing else on this machine is known to hold models (no ComfyUI)."""
        return {}

    def progress(self, node_id: str | None, total: int, desc: str = "H3") -> ProgressReporter:
        def shown(value, total, pv):  # what a UI would draw: kept as an event
            self.send_event("h3.preview", {"node": node_id, "value": value, "max": total, "step": pv.step,
                                           "width": pv.width, "height": pv.height, "bytes": len(pv.jpeg)})
        return LocalProgress(total, desc, shown)

    def interrupted(self) -> bool:
        return self.interrupt_flag.is_set()

    def interrupt_exception(self) -> BaseException:
        """What a node raises when the user interrupted it."""
        return H3Cancelled("interrupted: the request was cancelled on B")

    def user_error(self, exc: BaseException) -> BaseException:
        """Without ComfyUI the pack's own exception types stay (the runner and tests tell them apart)."""
        return exc

    def prompt_id(self) -> str | None:
        return self.current_prompt

    def queued_for_b(self) -> list[dict]:
        return []  # no queue of prompts outside ComfyUI

    def executing_node(self) -> str | None:
        return None

    def running_prompt(self) -> dict | None:
        return None

    def send_event(self, event: str, data: dict) -> None:
        self.events.append((event, data))
        for listener in list(self.listeners):
            listener(event, data)

    def progress_text(self, text: str, node_id: str | None) -> None:
        self.send_event("h3.text", {"node": node_id, "text": text})

    def output_dir(self) -> pathlib.Path:
        self._output.mkdir(parents=True, exist_ok=True)
        return self._output

    def set_output_dir(self, path: str | os.PathLike) -> None:
        self._output = pathlib.Path(path).resolve()

    def preview_method(self) -> str:
        return self.preview

    def preview_size(self) -> int:
        return 512

    def preview_factors(self) -> tuple[list, list, str] | None:
        return self.factors

    def preview_decoder(self) -> tuple[Callable, str] | None:
        return self.decoder

    def model_folders(self, kind: str = "diffusers") -> list[str]:
        """A's model roots without ComfyUI: ``H3_MODEL_DIRS`` (colon-separated), else none; for another ``kind``
        (``text_encoders``, ``vae``) its subfolder of each root, as in ComfyUI's ``models/``."""
        roots = [d for d in os.environ.get("H3_MODEL_DIRS", "").split(os.pathsep) if d.strip()]
        return roots if kind == "diffusers" else [os.path.join(d, kind) for d in roots]

    def tokenizer_folders(self) -> list[str]:
        """Folders holding the Qwen2 BPE vocabulary (``vocab.json``, ``merges.txt``): ``H3_TOKENIZER_DIRS``."""
        return [d for d in os.environ.get("H3_TOKENIZER_DIRS", "").split(os.pathsep) if d.strip()]
