"""Detailed profiling, switched on by ``H3_PROFILE=1`` (the executor forwards it to both actors before their
imports). Off, it costs nothing."""

from __future__ import annotations

import os


class _Profile:
    def __init__(self):
        self.path = None


class maybe_profile:
    """With ``H3_PROFILE=1`` (forwarded to the actors before their imports), a torch.profiler Chrome trace of the
    wrapped stage is written to ``H3_PROFILE_DIR`` (default ``/tmp/h3_profiles``); otherwise nothing happens."""

    def __init__(self, label: str, cuda: bool):
        self.label, self.cuda, self.result, self._prof = label, cuda, _Profile(), None

    def __enter__(self):
        if os.environ.get("H3_PROFILE", "") in ("", "0", "false"):
            return self.result
        import torch.profiler as tp

        acts = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if self.cuda else [])
        self._prof = tp.profile(activities=acts)
        self._prof.__enter__()
        return self.result

    def __exit__(self, *exc):
        if self._prof is None:
            return False
        self._prof.__exit__(*exc)
        if exc[0] is None:
            folder = os.environ.get("H3_PROFILE_DIR", "/tmp/h3_profiles")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{self.label}.json")
            self._prof.export_chrome_trace(path)
            self.result.path = path
        return False
