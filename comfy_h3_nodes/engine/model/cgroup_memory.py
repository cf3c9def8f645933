"""The memory a process's cgroup leaves it (v2 ``memory.max`` / ``memory.current``, v1 ``memory.limit_in_bytes`` /
``memory.usage_in_bytes``), for the memory plans: on a host whose memory is a cgroup's (a container, a systemd slice,
the two-host harness's hosts), that, not the machine's MemAvailable, is what a model can get. Stdlib only."""

from __future__ import annotations

import os
import pathlib

NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as a number near 2**63


def _cgroup_dirs(proc_cgroup: str, mountinfo: str) -> list[pathlib.Path]:
    """This process's memory cgroup folder and its ancestors up to the mount (v2 first, else v1's memory)."""
    mounts: dict[str, tuple[str, str]] = {}  # "2" / "memory" -> (mount point, root within the hierarchy)
    for ln in pathlib.Path(mountinfo).read_text().splitlines():
        left, _, right = ln.partition(" - ")
        f, r = left.split(), right.split()
        if r and r[0] == "cgroup2":
            mounts.setdefault("2", (f[4], f[3]))
        elif r and r[0] == "cgroup" and "memory" in r[-1].split(","):
            mounts["memory"] = (f[4], f[3])
    for ln in pathlib.Path(proc_cgroup).read_text().splitlines():
        _, ctrls, path = ln.split(":", 2)
        key = "memory" if "memory" in ctrls.split(",") else "2" if ctrls == "" else None
        if key in mounts:
            mount, root = mounts[key]
            if key == "2" and "memory" in mounts:
                continue  # hybrid: v1's memory controller holds the limit
            rel = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
            d = pathlib.Path(mount) / ("" if rel == "." else rel)
            out = [d]
            while d != pathlib.Path(mount) and d.parent != d:
                d = d.parent
                out.append(d)
            return out
    return []


def cgroup_memory_left(proc_cgroup: str = "/proc/self/cgroup",
                       mountinfo: str = "/proc/self/mountinfo") -> tuple[int, str] | None:
    """``(bytes, where)`` this process's memory cgroup still lets it use (the smallest over it and its ancestors:
    limit minus usage, page cache not counted as used), or None without a limit: on a host whose memory is a cgroup's
    (a container, a systemd slice, the two-host harness), that, not the machine's MemAvailable, is what a model gets."""
    best = None
    try:
        dirs = _cgroup_dirs(proc_cgroup, mountinfo)
    except (OSError, ValueError):
        return None
    for d in dirs:
        try:
            if (d / "memory.max").is_file():  # v2
                raw, used, inactive = (d / "memory.max").read_text().strip(), "memory.current", "inactive_file"
            elif (d / "memory.limit_in_bytes").is_file():  # v1
                raw, used, inactive = (d / "memory.limit_in_bytes").read_text().strip(), "memory.usage_in_bytes", \
                    "total_inactive_file"
            else:
                continue
            if raw == "max" or int(raw) >= NO_LIMIT:
                continue
            stat = dict(ln.split() for ln in (d / "memory.stat").read_text().splitlines() if len(ln.split()) == 2)
            usage = int((d / used).read_text()) - int(stat.get(inactive, 0))
            left = max(int(raw) - max(usage, 0), 0)
        except (OSError, ValueError):
            continue
        if best is None or left < best[0]:
            best = (left, f"the memory cgroup's limit ({_gib(int(raw))} at {d}) minus its {_gib(max(usage, 0))} in use")
    return best




def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
