"""The memory plans' cgroup figure (engine/model/cgroup_memory.py) on cgroup v2 and v1 layouts written to tmp."""

from __future__ import annotations

from comfy_h3_nodes.engine.model.cgroup_memory import cgroup_memory_left

GiB = 2**30


def _files(d, files: dict) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


def test_v2_limit_of_the_own_cgroup_and_its_parents(tmp_path):
    mount = tmp_path / "cg2"
    _files(mount / "slice" / "svc", {"memory.max": str(6 * GiB), "memory.current": str(2 * GiB),
                                     "memory.stat": f"anon 1\ninactive_file {GiB}\n"})
    _files(mount / "slice", {"memory.max": str(4 * GiB), "memory.current": str(3 * GiB), "memory.stat": "anon 1\n"})
    (tmp_path / "cgroup").write_text("0::/slice/svc\n")
    (tmp_path / "mountinfo").write_text(f"30 1 0:26 / {mount} rw - cgroup2 cgroup2 rw\n")
    left, where = cgroup_memory_left(str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    assert left == GiB and "4.0 GiB" in where and str(mount / "slice") in where  # the parent's limit is the smaller
    (mount / "slice" / "memory.max").write_text("max\n")
    left, where = cgroup_memory_left(str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    assert left == 5 * GiB, where  # 6 GiB minus 1 GiB in use (the inactive page cache is not counted)


def test_v1_memory_controller_and_no_limit(tmp_path):
    mount = tmp_path / "memory"
    _files(mount / "h3b", {"memory.limit_in_bytes": str(3 * GiB), "memory.usage_in_bytes": str(GiB),
                           "memory.stat": "total_inactive_file 0\n"})
    _files(mount, {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": "1",
                   "memory.stat": ""})
    (tmp_path / "cgroup").write_text("4:memory:/h3b\n0::/\n")
    (tmp_path / "mountinfo").write_text(f"31 1 0:27 / {mount} rw - cgroup cgroup rw,memory\n"
                                        f"32 1 0:28 / {tmp_path / 'unified'} rw - cgroup2 cgroup2 rw\n")
    assert cgroup_memory_left(str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))[0] == 2 * GiB
    (tmp_path / "cgroup").write_text("4:memory:/\n")
    assert cgroup_memory_left(str(tmp_path / "cgroup"), str(tmp_path / "mountinfo")) is None
