"""LoRA patches of ComfyUI's own model (``LoraLoaderModelOnly`` on the pack's remote ``MODEL``) applied on B.

A sends each patch in ComfyUI's names (:class:`~comfy_h3_nodes.engine.contract.ComfyLora`: the layer of
Comfy-Org's file, up, down, ``strength * alpha / rank``). B maps ComfyUI's layer to diffusers' modules the way its
loader maps the file (:func:`comfy_h3_nodes.engine.model.comfy_dit.comfy_to_diffusers`: a stacked ``qkv_proj`` is
diffusers' ``to_q``/``to_k``/``to_v``, so the rows of ``up`` are cut the same way; ``mlp.fc1``'s halves swap) and adds
``scale * up(down(x))`` to each module's output: the bypass form of ComfyUI's LoRA (``LoRAAdapter.h``), which leaves
the resident weights as they are, so a sampling without the LoRA (or with strength 0) runs on exactly the weights it
ran on before, and nothing has to be restored.
"""

from __future__ import annotations

import torch

from comfy_h3_nodes.engine.contract.forward_payloads import ComfyLoraSet
from comfy_h3_nodes.engine.model import comfy_dit


class ComfyLoraHooks:
    """The LoRA set active on one transformer (at most one set at a time)."""

    def __init__(self, model, file_names):
        self.model = model
        self.targets: dict[str, list[tuple[str, str, int]]] = {}  # ComfyUI weight -> [(diffusers module, how, part)]
        for dname, (cname, how, part) in comfy_dit.comfy_to_diffusers(file_names).items():
            if dname.endswith(".weight"):
                self.targets.setdefault(cname, []).append((dname[: -len(".weight")], how, part))
        self.active_key = None
        self._handles: list = []

    def activate(self, key, lora_set: ComfyLoraSet | None, device, dtype) -> int:
        """Apply ``lora_set`` (None: none) under ``key``; returns the number of modules patched."""
        if key == self.active_key:
            return len(self._handles)
        self.clear()
        if lora_set is None:
            return 0
        per_module: dict[str, list] = {}
        for p in lora_set.patches:
            targets = self.targets.get(p.key)
            if not targets:
                raise ValueError(f"the LoRA patches {p.key}, which B's transformer does not have (a LoRA for another "
                                 "model?): remove that LoRA loader, or pick the file it was trained for.")
            up, down = p.up.to_torch().float(), p.down.to_torch().float()
            for module, how, part in targets:
                per_module.setdefault(module, []).append(
                    (down.to(device), comfy_dit.cut_rows(up, how, part, None).to(device), p.scale))
        modules = dict(self.model.named_modules())
        for name, terms in per_module.items():
            self._handles.append(modules[name].register_forward_hook(_adder(terms)))
        self.active_key = key
        return len(self._handles)

    def clear(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.active_key = None


def _adder(terms):
    def hook(_module, args, output):
        x = args[0].float()
        extra = sum(scale * torch.nn.functional.linear(torch.nn.functional.linear(x, down), up)
                    for down, up, scale in terms)
        return output + extra.to(output.dtype)
    return hook
