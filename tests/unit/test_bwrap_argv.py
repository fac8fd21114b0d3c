"""The bubblewrap command line a policy becomes (execution/sandbox/bwrap.py), on a fake host."""
from __future__ import annotations

import pytest

from execution.sandbox.bwrap import SandboxConfigError, SandboxPlan, build_argv
from execution.sandbox.policy import load_policy

WORK = "/spool/work/7/3"
SOCK = "/tmp/tco-runner-1-0/sock"


class FakeFS:
    """A Debian 12 host: merged /usr, /etc/resolv.conf a plain file, nothing else linked."""

    links = {"/bin": "usr/bin", "/sbin": "usr/sbin", "/lib": "usr/lib", "/lib64": "usr/lib64"}
    dirs = {"/", "/usr", "/usr/bin", "/usr/lib", "/usr/lib64", "/usr/sbin", "/etc", "/tmp", "/var", "/var/tmp",
            "/run", "/opt", "/opt/data", "/spool", "/spool/work", "/tmp/tco-runner-1-0", "/code", "/code/worker",
            "/home", "/home/tco"}
    files = {"/etc/resolv.conf", "/usr/bin/python3.11", "/secrets.json"}

    def lexists(self, path):
        return path in self.links or path in self.dirs or path in self.files

    def isdir(self, path):
        return path in self.dirs or (path in self.links and self.realpath(path) in self.dirs)

    def islink(self, path):
        return path in self.links

    def readlink(self, path):
        return self.links[path]

    def realpath(self, path):
        for link, target in self.links.items():
            if path == link or path.startswith(link + "/"):
                return "/" + target + path[len(link):]
        if path == "/usr/bin/python3":
            return "/usr/bin/python3.11"
        return path


def plan_for(policy_text: str, **overrides) -> SandboxPlan:
    fields = dict(policy=load_policy(policy_text), workdir=WORK, socket_dir=SOCK,
                  agent_argv=["/usr/bin/python3", "agent.py"], env={"HOME": "/sandbox", "PATH": "/usr/bin"},
                  masks=["/spool", "/secrets.json", "/tmp/tco-runner-1-0"], interpreter="/usr/bin/python3",
                  status_fd=5, json_status_fd=6, stdout_fd=7, stderr_fd=8, data_fds={"/etc/passwd": 9},
                  watch_fd=10)
    fields.update(overrides)
    return SandboxPlan(**fields)


def argv_for(policy_text: str, **overrides) -> list[str]:
    return build_argv(plan_for(policy_text, **overrides), FakeFS())


def pairs(argv: list[str], flag: str) -> list[tuple[str, ...]]:
    """Each occurrence of ``flag`` with its arguments."""
    width = {"--ro-bind": 2, "--bind": 2, "--symlink": 2, "--ro-bind-data": 2, "--tmpfs": 1, "--remount-ro": 1,
             "--setenv": 2, "--proc": 1, "--dev": 1}[flag]
    return [tuple(argv[i + 1:i + 1 + width]) for i, a in enumerate(argv) if a == flag]


def mount_order(argv: list[str]) -> list[str]:
    """Destinations of mount operations, in order."""
    out = []
    for i, a in enumerate(argv):
        if a in ("--ro-bind", "--bind", "--symlink", "--ro-bind-data"):
            out.append(argv[i + 2])
        elif a in ("--tmpfs", "--proc", "--dev", "--remount-ro"):
            out.append(argv[i + 1])
    return out


SYSTEM = """version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /lib64, /bin, /etc]
  read_write: [/sandbox, /tmp]
process: {run_as_user: sandbox, run_as_group: sandbox}
"""


def test_every_namespace_is_unshared_and_the_agent_is_not_root():
    argv = argv_for(SYSTEM)
    assert argv[0] == "bwrap"
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                 "--as-pid-1", "--clearenv"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert argv[argv.index("--uid") + 1] == "1000" and argv[argv.index("--gid") + 1] == "1000"
    assert "--share-net" not in argv and "--unshare-net" not in argv  # --unshare-all covers the network


def test_numeric_ids_are_used_inside():
    argv = argv_for('version: 1\nfilesystem_policy: {read_only: [/usr]}\nprocess: {run_as_user: "1500", run_as_group: "1600"}\n')
    assert argv[argv.index("--uid") + 1] == "1500" and argv[argv.index("--gid") + 1] == "1600"


def test_listed_paths_are_bound_with_their_mode_and_merged_usr_links_stay_links():
    argv = argv_for(SYSTEM)
    assert ("/usr", "/usr") in pairs(argv, "--ro-bind")
    assert ("/etc", "/etc") in pairs(argv, "--ro-bind")
    assert set(pairs(argv, "--symlink")) == {("usr/bin", "/bin"), ("usr/sbin", "/sbin"), ("usr/lib", "/lib"),
                                             ("usr/lib64", "/lib64")}
    assert (WORK, "/sandbox") in pairs(argv, "--bind")
    assert ("/tmp",) in pairs(argv, "--tmpfs") and ("/tmp",) not in pairs(argv, "--remount-ro")
    assert (SOCK, "/run/tco") in pairs(argv, "--ro-bind")
    assert ("/dev/null", "/etc/resolv.conf") in pairs(argv, "--ro-bind")  # no name resolver
    assert ("9", "/etc/passwd") in pairs(argv, "--ro-bind-data")


def test_mounts_go_from_shallow_to_deep_and_the_root_ends_read_only():
    argv = argv_for(SYSTEM + "  # nothing\n")
    order = mount_order(argv)
    assert order.index("/etc") < order.index("/etc/resolv.conf") < order.index("/etc/passwd")
    assert order[:2] == ["/proc", "/dev"]
    assert order[-2:] == ["/dev", "/"]  # --remount-ro /dev and / after every mount
    assert pairs(argv, "--remount-ro")[-2:] == [("/dev",), ("/",)]


def test_the_work_directory_is_read_only_without_include_workdir():
    argv = argv_for("version: 1\nfilesystem_policy: {read_only: [/usr]}\n")
    assert (WORK, "/sandbox") in pairs(argv, "--ro-bind")
    assert (WORK, "/sandbox") not in pairs(argv, "--bind")


def test_the_hosts_scratch_directories_are_private_even_under_root():
    argv = argv_for("version: 1\nfilesystem_policy: {read_only: ['/'], read_write: [/sandbox]}\n")
    assert ("/", "/") in pairs(argv, "--ro-bind")
    for private in ("/tmp", "/var/tmp", "/run"):
        assert (private,) in pairs(argv, "--tmpfs") and (private,) in pairs(argv, "--remount-ro")
    # tco's own files are covered too: the spool (a directory) and the credentials (a file).
    assert ("/spool",) in pairs(argv, "--tmpfs")
    assert ("/dev/null", "/secrets.json") in pairs(argv, "--ro-bind")
    order = mount_order(argv)
    assert order.index("/") < order.index("/proc") < order.index("/spool")


def test_a_read_only_tmp_is_an_empty_read_only_tmpfs():
    argv = argv_for("version: 1\nfilesystem_policy: {read_only: [/usr, /tmp]}\n")
    assert ("/tmp",) in pairs(argv, "--tmpfs") and ("/tmp",) in pairs(argv, "--remount-ro")
    assert ("/tmp", "/tmp") not in pairs(argv, "--ro-bind")


def test_a_path_inside_tcos_files_is_refused():
    with pytest.raises(SandboxConfigError, match="inside /spool"):
        argv_for("version: 1\nfilesystem_policy: {read_only: [/usr, /spool/work]}\n")
    with pytest.raises(SandboxConfigError, match="inside /secrets.json"):
        argv_for("version: 1\nfilesystem_policy: {read_only: [/usr, /secrets.json]}\n")


@pytest.mark.parametrize("path", ["/proc", "/dev", "/dev/pts", "/proc/1"])
def test_proc_and_dev_cannot_be_listed(path):
    with pytest.raises(SandboxConfigError, match="own /proc and /dev"):
        argv_for(f"version: 1\nfilesystem_policy: {{read_only: [/usr, {path}]}}\n")


def test_paths_missing_on_the_host_are_skipped_with_a_note():
    plan = plan_for("version: 1\nfilesystem_policy: {read_only: [/usr, /nowhere]}\n")
    argv = build_argv(plan, FakeFS())
    assert "/nowhere" not in argv
    assert plan.notes == ["/nowhere: not on this host; skipped"]


def test_the_relay_needs_its_interpreter_inside():
    with pytest.raises(SandboxConfigError, match="list its directory"):
        argv_for("version: 1\nfilesystem_policy: {read_only: [/etc]}\n")


def test_the_environment_is_exactly_the_plans():
    argv = argv_for(SYSTEM)
    assert argv.index("--clearenv") < argv.index("--setenv")
    assert pairs(argv, "--setenv") == [("HOME", "/sandbox"), ("PATH", "/usr/bin")]


def test_the_command_is_the_relay_then_the_agent():
    argv = argv_for(SYSTEM)
    relay = len(argv) - 1 - argv[::-1].index("/run/tco-relay.py")  # the command, not the bind
    assert argv[relay - 3:relay] == ["/usr/bin/python3.11", "-I", "-S"]
    tail = argv[relay:]
    assert tail[tail.index("--status-fd") + 1] == "5" and tail[tail.index("--watch-fd") + 1] == "10"
    assert tail[tail.index("--socket") + 1] == "/run/tco/proxy.sock"
    assert tail[tail.index("--") + 1:] == ["/usr/bin/python3", "agent.py"]
    assert argv[argv.index("--json-status-fd") + 1] == "6"
    assert argv[argv.index("--chdir") + 1] == "/sandbox"
    assert any(dst == "/run/tco-relay.py" and src.endswith("execution/sandbox/relay.py")
               for src, dst in pairs(argv, "--ro-bind"))


def test_admin_covers_hide_a_directory_but_not_what_is_listed_inside_it():
    plan = plan_for("version: 1\nfilesystem_policy: {read_only: ['/', /opt/data]}\n", covers=["/opt"])
    argv = build_argv(plan, FakeFS())
    order = mount_order(argv)
    assert ("/opt",) in pairs(argv, "--tmpfs")  # shown under "/", so covered
    assert ("/opt/data", "/opt/data") in pairs(argv, "--ro-bind")
    assert order.index("/opt") < order.index("/opt/data")  # ... and /opt/data is shown on top of it
