"""Loading a Qwen3-VL processor that has no video processor (torchvision absent).

transformers' video processors need torchvision, which cannot be installed beside the CPU torch of our CI (PyPI's
torchvision is a CUDA build there). Video references therefore cannot be processed in CI; image and audio references
and text work. The shim below changes transformers' behaviour only in the case that would otherwise raise.
"""

from __future__ import annotations

import os

import transformers
from transformers import processing_utils
from transformers.models.auto import video_processing_auto
from transformers.processing_utils import ProcessorMixin

# --------------------------------------------------------------------------------------------------

_COMPAT_MARKER = "_comfy_h3_no_video_processor_compat"


def _has_video_processor_config(path, subfolder, processor_dict) -> bool:
    if isinstance(processor_dict, dict) and "video_processor" in processor_dict:
        return True
    folder = os.path.join(str(path), subfolder or "")
    if not os.path.isdir(folder):
        # A hub id: leave it to transformers (this shim only handles local folders).
        return True
    return any(
        os.path.isfile(os.path.join(folder, name))
        for name in ("video_preprocessor_config.json", "preprocessor_config.json")
    )


# The classmethod of `ProcessorMixin` that loads the sub-processors, by transformers version (newest first).
_SUB_PROCESSOR_LOADERS = ("_resolve_subprocessors", "_get_arguments_from_pretrained")


def _sub_processor_loader_name() -> str:
    for name in _SUB_PROCESSOR_LOADERS:
        if isinstance(ProcessorMixin.__dict__.get(name), classmethod):
            return name
    raise RuntimeError(
        f"transformers {transformers.__version__} has none of {', '.join(_SUB_PROCESSOR_LOADERS)} on ProcessorMixin, "
        "so a Qwen3-VL processor folder without a video processor cannot be loaded without torchvision: install "
        "torchvision, or a transformers version the pack knows (see requirements.txt)."
    )


def ensure_processor_compat() -> None:
    """Let a processor folder without a video processor load as `video_processor=None`.

    transformers' video processors are torchvision-only, and a `ProcessorMixin` refuses a `None` sub-processor
    while torchvision is missing. This (idempotent) shim changes two things, and only for the case that would
    otherwise raise:
      - `ProcessorMixin.check_argument_for_proper_class` accepts `None` for a `video_processor` attribute;
      - the classmethod that loads the sub-processors (`_resolve_subprocessors` since transformers 5.25,
        `_get_arguments_from_pretrained` before) passes `None` as the video processor of a *local* processor folder
        that holds no video processor config at all.
    A folder that does carry a video processor config still loads (or fails) exactly as before.
    """
    if getattr(ProcessorMixin, _COMPAT_MARKER, False):
        return

    original_check = ProcessorMixin.check_argument_for_proper_class
    loader_name = _sub_processor_loader_name()
    original_get_arguments = ProcessorMixin.__dict__[loader_name].__func__

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument is None and processing_utils._get_modality_for_attribute(argument_name) == "video_processor":
            return None
        return original_check(self, argument_name, argument)

    def _get_arguments_from_pretrained(cls, pretrained_model_name_or_path, processor_dict=None, **kwargs):
        if "video_processor" not in cls.get_attributes() or _has_video_processor_config(
            pretrained_model_name_or_path, kwargs.get("subfolder"), processor_dict
        ):
            return original_get_arguments(cls, pretrained_model_name_or_path, processor_dict, **kwargs)

        auto_cls = video_processing_auto.AutoVideoProcessor
        saved = auto_cls.__dict__["from_pretrained"]
        auto_cls.from_pretrained = classmethod(lambda _cls, *args, **kw: None)
        try:
            return original_get_arguments(cls, pretrained_model_name_or_path, processor_dict, **kwargs)
        finally:
            setattr(auto_cls, "from_pretrained", saved)

    ProcessorMixin.check_argument_for_proper_class = check_argument_for_proper_class
    setattr(ProcessorMixin, loader_name, classmethod(_get_arguments_from_pretrained))
    setattr(ProcessorMixin, _COMPAT_MARKER, True)


