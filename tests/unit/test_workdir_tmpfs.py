"""The work directory as a tmpfs of the disk limit's size (issue 23, finding 1: the kernel holds the
limit): the bubblewrap argv, the runner's setting, the measure and the copy back to the spool."""
from __future__ import annotations

import dataclasses
import os

import pytest

from execution.runner.config import RunnerError
from execution.runner.workdir_tmpfs import keep_tree, usage, view_path, workdir_mode
from execution.sandbox.bwrap import SandboxConfigError, build_argv
from execution.sandbox.plan import SandboxFds, SandboxLimits
from tests.unit.test_bwrap_argv import SOCK, WORK, FakeFS, plan_for

POLICY = ("version: 1\nfilesystem_policy:\n  include_workdir: true\n  read_only: [/usr]\n"
          "process: {run_as_user: sandbox, run_as_group: sandbox}\n")


def tmpfs_plan(policy: str = POLICY, work_bytes: int = 64 << 20):
    plan = plan_for(policy)
    return dataclasses.replace(plan, limits=dataclasses.replace(plan.limits, work_bytes=work_bytes),
                               fds=dataclasses.replace(plan.fds, files={"/sandbox/input.json": 11}, hold=12))


def test_the_work_directory_is_a_tmpfs_of_the_limits_size_with_the_input_copied_in():
    argv = build_argv(tmpfs_plan(work_bytes=64 << 20), FakeFS())
    at = argv.index("/sandbox")
    assert argv[at - 3:at + 1] == ["--size", str(64 << 20), "--tmpfs", "/sandbox"]
    # The host work directory is not shown at all: nothing the agent writes lands on the spool's disk.
    assert WORK not in argv
    at = argv.index("/sandbox/input.json")
    assert argv[at - 4:at + 1] == ["--perms", "0600", "--file", "11", "/sandbox/input.json"]
    assert argv.index("/sandbox/input.json") > argv.index("--tmpfs")  # made inside the tmpfs
    # The relay waits on the hold pipe until the runner holds the tmpfs.
    assert argv[argv.index("--hold-fd") + 1] == "12" and argv.index("--hold-fd") < argv.index("--")
    assert SOCK in argv


def test_a_read_only_work_directory_is_a_tmpfs_remounted_read_only_after_the_input():
    policy = POLICY.replace("include_workdir: true", "include_workdir: false")
    argv = build_argv(tmpfs_plan(policy), FakeFS())
    remounts = [argv[i + 1] for i, a in enumerate(argv) if a == "--remount-ro"]
    assert "/sandbox" in remounts and argv.index("--file") < argv.index("--remount-ro")


def test_without_a_work_limit_the_spools_work_directory_is_bound_as_before():
    argv = build_argv(plan_for(POLICY), FakeFS())
    at = argv.index(WORK)
    assert argv[at - 1:at + 2] == ["--bind", WORK, "/sandbox"]
    assert "--hold-fd" not in argv and "--file" not in argv


@pytest.mark.parametrize("work_bytes", [0, -1])
def test_a_work_limit_that_is_not_positive_is_refused(work_bytes):
    with pytest.raises(SandboxConfigError, match="positive"):
        build_argv(tmpfs_plan(work_bytes=work_bytes), FakeFS())


def test_the_fds_passed_include_the_input_and_the_hold_pipe():
    fds = SandboxFds(status=5, json_status=6, stdout=7, stderr=8, files={"/sandbox/input.json": 11}, hold=12)
    assert sorted(fds.passed()) == [5, 6, 7, 8, 11, 12]
    assert SandboxLimits().work_bytes is None  # the plan's default: the old bind


@pytest.mark.parametrize(("value", "mode"), [(None, "tmpfs"), ("", "tmpfs"), ("tmpfs", "tmpfs"), ("spool", "spool"),
                                             (" spool ", "spool")])
def test_the_work_directory_mode_is_read_from_the_environment(value, mode):
    environ = {} if value is None else {"TCO_SANDBOX_WORKDIR": value}
    assert workdir_mode(environ) == mode


@pytest.mark.parametrize("value", ["disk", "TMPFS", "bind"])
def test_an_unknown_work_directory_mode_is_a_configuration_error(value):
    with pytest.raises(RunnerError, match="TCO_SANDBOX_WORKDIR"):
        workdir_mode({"TCO_SANDBOX_WORKDIR": value})


def test_usage_is_the_file_systems_blocks_in_use(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        used, full = usage(fd)
        info = os.statvfs(tmp_path)
        assert used == (info.f_blocks - info.f_bfree) * info.f_frsize and full is (info.f_bavail == 0)
        assert os.path.samefile(view_path(fd), tmp_path)
    finally:
        os.close(fd)


def test_the_tree_the_agent_left_is_kept_without_following_its_links(tmp_path):
    src, dest = tmp_path / "tmpfs", tmp_path / "work"
    (src / "sub" / "deep").mkdir(parents=True)
    dest.mkdir()
    (src / "result.json").write_bytes(b'{"ok": 1}')
    (src / "sub" / "deep" / "log.txt").write_bytes(b"x" * 70_000)
    (src / "closed").mkdir()
    (src / "closed" / "hidden.txt").write_bytes(b"h")
    os.chmod(src / "closed", 0)  # an agent's chmod 0: the runner's own directory, opened again
    (src / "secret-link").symlink_to("/etc/hostname")
    (src / "dir-link").symlink_to(tmp_path)
    os.mkfifo(src / "fifo")
    # A previous attempt's agent left a link where a file is kept: replaced, not followed.
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"untouched")
    (dest / "result.json").symlink_to(outside)
    kept = keep_tree(str(src), str(dest), max_bytes=1 << 20)
    assert kept == {"files": 3, "bytes": 9 + 70_000 + 1, "skipped": 3}
    assert (dest / "result.json").read_bytes() == b'{"ok": 1}' and not (dest / "result.json").is_symlink()
    assert outside.read_bytes() == b"untouched"
    assert (dest / "sub" / "deep" / "log.txt").stat().st_size == 70_000
    assert (dest / "closed" / "hidden.txt").read_bytes() == b"h"
    assert not os.path.lexists(dest / "secret-link") and not os.path.lexists(dest / "dir-link")
    assert not os.path.lexists(dest / "fifo")
    assert oct((dest / "sub" / "deep" / "log.txt").stat().st_mode & 0o777) == "0o600"


def test_the_copy_back_stops_at_its_entry_cap(tmp_path):
    src, dest = tmp_path / "tmpfs", tmp_path / "work"
    src.mkdir()
    dest.mkdir()
    for n in range(30):
        (src / f"f{n:02d}").write_bytes(b"1")
    kept = keep_tree(str(src), str(dest), max_bytes=1 << 20, max_entries=10)
    assert kept == {"files": 10, "bytes": 10, "skipped": 20}
    assert sorted(os.listdir(dest)) == [f"f{n:02d}" for n in range(10)]


def test_sparse_files_and_hard_links_cannot_make_the_copy_back_outgrow_the_work_limit(tmp_path):
    """A hostile agent's attack (issue 23, a fresh helper on a clean clone): files truncated to 1 GiB
    (sparse: a few blocks on the tmpfs) and one 8 MiB file hard-linked 40 times filled 8 MiB of its
    64 MiB tmpfs and left 3.4 GiB on the spool's disk. Here, at a smaller scale: the copy holds at most
    the work limit, each file's data once."""
    src, dest = tmp_path / "tmpfs", tmp_path / "work"
    src.mkdir()
    dest.mkdir()
    limit = 4 << 20                                          # the task's work directory limit: 4 MiB
    for n in range(3):
        with open(src / f"sparse{n}", "wb") as f:
            f.truncate(1 << 30)                              # 1 GiB long, nothing written
    (src / "data").write_bytes(b"d" * (1 << 20))            # 1 MiB
    for n in range(40):
        os.link(src / "data", src / f"link{n:02d}")
    kept = keep_tree(str(src), str(dest), max_bytes=limit)
    written = sum(os.stat(dest / name).st_size for name in os.listdir(dest))
    blocks = sum(os.stat(dest / name).st_blocks * 512 for name in os.listdir(dest))
    assert kept["bytes"] == written == 1 << 20 and blocks <= limit   # the data once; no sparse file
    assert kept["files"] == 1 and kept["skipped"] == 3 + 40          # 3 too long, 40 further links
    assert sorted(os.listdir(dest)) == ["data"]


def test_the_copy_back_keeps_what_fits_and_skips_what_would_pass_the_limit(tmp_path):
    src, dest = tmp_path / "tmpfs", tmp_path / "work"
    src.mkdir()
    dest.mkdir()
    for name, size in (("a", 600), ("b", 600), ("c", 300)):   # copied in name order
        (src / name).write_bytes(name.encode() * size)
    kept = keep_tree(str(src), str(dest), max_bytes=1000)
    assert kept == {"files": 2, "bytes": 900, "skipped": 1}
    assert sorted(os.listdir(dest)) == ["a", "c"]
