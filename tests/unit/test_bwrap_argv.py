"""The bubblewrap command line a policy becomes (execution/sandbox/bwrap.py), on a fake host."""
from __future__ import annotations

import dataclasses

import pytest

from execution.sandbox.bwrap import SandboxConfigError, build_argv
from execution.sandbox.plan import MAX_PROCESSES, TMPFS_BYTES, HiddenPaths, SandboxFds, SandboxLimits, SandboxPlan
from execution.sandbox.policy.load import load_policy

WORK = "/spool/work/7/3"
SOCK = "/tmp/tco-runner-1-0/sock"


class FakeFS:
    """A Debian 12 host: merged /usr, /etc/resolv.conf a plain file, nothing else linked."""

    links = {"/bin": "usr/bin", "/sbin": "usr/sbin", "/lib": "usr/lib", "/lib64": "usr/lib64",
             "/run/shm": "dev/shm", "/var/lock": "run/lock", "/opt/to-spool": "spool", "/opt/to-root": "",
             "/opt/to-proc": "proc/1/root", "/opt/to-state": "var/lib/tco/secret_key"}
    dirs = {"/", "/usr", "/usr/bin", "/usr/lib", "/usr/lib64", "/usr/sbin", "/etc", "/tmp", "/var", "/var/tmp",
            "/run", "/run/lock", "/dev/shm", "/opt", "/opt/data", "/spool", "/spool/work", "/tmp/tco-runner-1-0",
            "/tmp/4243.1.all.q", "/code", "/code/worker", "/home", "/home/tco", "/var/lib", "/var/lib/tco",
            "/var/lib/tco/sweeps", "/mnt", "/mnt/spool-again", "/mnt/spool-again/work"}
    files = {"/etc/resolv.conf", "/usr/bin/python3.11", "/secrets.json", "/var/lib/tco/secret_key",
             "/var/lib/tco/admin-password"}
    #: Bind mounts: the same directory mounted at another place too (/proc/self/mountinfo).
    aliases = {"/spool": ["/mnt/spool-again"]}

    def mount_aliases(self, path):
        return self.aliases.get(path, [])

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


def plan_for(policy_text: str, *, masks=("/spool", "/secrets.json", "/tmp/tco-runner-1-0"), state=(), shared=(),
             tmpfs_bytes=TMPFS_BYTES, max_processes=MAX_PROCESSES) -> SandboxPlan:
    return SandboxPlan(policy=load_policy(policy_text), workdir=WORK, socket_dir=SOCK,
                       agent_argv=["/usr/bin/python3", "agent.py"], env={"HOME": "/sandbox", "PATH": "/usr/bin"},
                       interpreter="/usr/bin/python3",
                       fds=SandboxFds(status=5, json_status=6, stdout=7, stderr=8, data={"/etc/passwd": 9, "/run/tco-relay.py": 11},
                                      watch=10),
                       hidden=HiddenPaths(masks=tuple(masks), state=tuple(state), shared=tuple(shared)),
                       limits=SandboxLimits(tmpfs_bytes=tmpfs_bytes, max_processes=max_processes))


def argv_for(policy_text: str, **overrides) -> list[str]:
    return build_argv(plan_for(policy_text, **overrides), FakeFS())


def pairs(argv: list[str], flag: str) -> list[tuple[str, ...]]:
    """Each occurrence of ``flag`` with its arguments."""
    width = {"--size": 1, "--ro-bind": 2, "--bind": 2, "--symlink": 2, "--ro-bind-data": 2, "--tmpfs": 1, "--remount-ro": 1,
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


def test_the_hosts_scratch_directories_are_private_even_under_a_listed_ancestor():
    # "/" itself cannot be listed (bubblewrap cannot make /sandbox in the host's root); its
    # contents under another name are covered: see the /opt/to-root test below.
    with pytest.raises(SandboxConfigError, match="/ cannot be listed whole"):
        argv_for("version: 1\nfilesystem_policy: {read_only: ['/'], read_write: [/sandbox]}\n")
    argv = argv_for("version: 1\nfilesystem_policy: {read_only: [/usr, /var], read_write: [/sandbox]}\n",
                    state=["/var/lib/tco"])
    assert ("/var", "/var") in pairs(argv, "--ro-bind")
    for covered in ("/var/tmp", "/var/lib/tco"):
        assert (covered,) in pairs(argv, "--tmpfs") and (covered,) in pairs(argv, "--remount-ro")
    order = mount_order(argv)
    assert order.index("/var") < order.index("/var/tmp") and order.index("/var") < order.index("/var/lib/tco")


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
    # The relay's script is copied in from its descriptor: a bind would show the repository's path in
    # the sandbox's /proc/self/mountinfo (issue 23, finding 10).
    assert ("11", "/run/tco-relay.py") in pairs(argv, "--ro-bind-data")
    assert not any("execution/sandbox" in src for src, _ in pairs(argv, "--ro-bind"))


def test_a_plan_without_the_relays_descriptor_is_refused():
    plan = plan_for(SYSTEM)
    plan = dataclasses.replace(plan, fds=dataclasses.replace(plan.fds, data={"/etc/passwd": 9}))
    with pytest.raises(SandboxConfigError, match="relay's script"):
        build_argv(plan, FakeFS())


def test_the_state_directory_hides_all_but_its_shared_directories():
    # TCO_SANDBOX_MASK (tco's state) and TCO_SANDBOX_SHARED (a demo's outputs inside it).
    plan = plan_for("version: 1\nfilesystem_policy: {read_only: [/usr, /var, /var/lib/tco/sweeps]}\n",
                    state=["/var/lib/tco"], shared=["/var/lib/tco/sweeps"])
    argv = build_argv(plan, FakeFS())
    order = mount_order(argv)
    assert ("/var/lib/tco",) in pairs(argv, "--tmpfs")  # shown under /var, so covered
    assert ("/var/lib/tco/sweeps", "/var/lib/tco/sweeps") in pairs(argv, "--ro-bind")
    assert order.index("/var/lib/tco") < order.index("/var/lib/tco/sweeps")  # ... shown on top of it


def test_a_hidden_file_inside_a_hidden_directory_gets_no_mount_point_naming_it():
    # CI on PostgreSQL: /etc/tco masked as a directory and its secret files masked one by one
    # listed the files' names inside the empty tmpfs (a /dev/null bind, hence a mount point, for each).
    plan = plan_for("version: 1\nfilesystem_policy: {read_only: [/usr, /var]}\n",
                    masks=["/spool", "/var/lib/tco/secret_key", "/tmp/tco-runner-1-0"],
                    state=["/var/lib/tco", "/var/lib/tco/admin-password"])
    argv = build_argv(plan, FakeFS())
    assert ("/var/lib/tco",) in pairs(argv, "--tmpfs")
    null_binds = [dest for src, dest in pairs(argv, "--ro-bind") if src == "/dev/null"]
    assert "/var/lib/tco/secret_key" not in null_binds and "/var/lib/tco/admin-password" not in null_binds
    # Alone (its directory not hidden), the same file is still covered by /dev/null.
    alone = build_argv(plan_for("version: 1\nfilesystem_policy: {read_only: [/usr, /var]}\n",
                                masks=["/var/lib/tco/secret_key"]), FakeFS())
    assert ("/dev/null", "/var/lib/tco/secret_key") in pairs(alone, "--ro-bind")


# ------------------------------------------------ issue 11: tco's own state is never bindable


@pytest.mark.parametrize("listed", ["/var/lib/tco/secret_key", "/var/lib/tco/admin-password", "/var/lib/tco"])
def test_issue11_state_files_listed_read_only_are_refused(listed):
    # The attack: a policy listing var/secret_key and var/admin-password read-only.
    with pytest.raises(SandboxConfigError, match="inside /var/lib/tco"):
        build_argv(plan_for(f"version: 1\nfilesystem_policy: {{read_only: [/usr, {listed}]}}\n",
                            state=["/var/lib/tco"]), FakeFS())


def test_a_shared_directory_never_opens_the_spool_or_the_credentials():
    # Only a directory inside the state directory may be shared, never one inside a mask.
    with pytest.raises(SandboxConfigError, match="inside /spool"):
        build_argv(plan_for("version: 1\nfilesystem_policy: {read_only: [/usr, /spool/work]}\n",
                            state=["/spool"], shared=["/spool/work"]), FakeFS())


@pytest.mark.parametrize("listed,resolved", [("/opt/to-spool", "/spool"), ("/opt/to-state", "/var/lib/tco")])
def test_a_link_into_a_masked_directory_is_refused(listed, resolved):
    with pytest.raises(SandboxConfigError, match=f"resolves to {resolved}.* is inside {resolved}"):
        build_argv(plan_for(f"version: 1\nfilesystem_policy: {{read_only: [/usr, {listed}]}}\n",
                            state=["/var/lib/tco"]), FakeFS())


def test_a_bind_mount_of_a_masked_directory_is_refused_and_covered():
    # /mnt/spool-again is the spool mounted a second time: inside it is inside the spool.
    with pytest.raises(SandboxConfigError, match="inside /mnt/spool-again"):
        argv_for("version: 1\nfilesystem_policy: {read_only: [/usr, /mnt/spool-again/work]}\n")
    argv = argv_for("version: 1\nfilesystem_policy: {read_only: [/usr, /mnt]}\n")
    assert ("/mnt", "/mnt") in pairs(argv, "--ro-bind") and ("/mnt/spool-again",) in pairs(argv, "--tmpfs")


def test_a_link_above_masked_paths_covers_them_where_they_appear_inside():
    # /opt/to-root -> "/": the spool, the credentials and the host's /tmp show up under /opt/to-root.
    argv = argv_for("version: 1\nfilesystem_policy: {read_only: [/usr, /opt/to-root]}\n", state=["/var/lib/tco"])
    assert ("/", "/opt/to-root") in pairs(argv, "--ro-bind")
    tmpfs = pairs(argv, "--tmpfs")
    for inside in ("/opt/to-root/spool", "/opt/to-root/tmp", "/opt/to-root/run", "/opt/to-root/var/lib/tco",
                   "/opt/to-root/dev/shm"):
        assert (inside,) in tmpfs and (inside,) in pairs(argv, "--remount-ro"), inside
    assert ("/dev/null", "/opt/to-root/secrets.json") in pairs(argv, "--ro-bind")
    order = mount_order(argv)
    assert order.index("/opt/to-root") < order.index("/opt/to-root/spool")


def test_proc_1_root_through_a_link_is_refused():
    with pytest.raises(SandboxConfigError, match="resolves to /proc/1/root.*own /proc and /dev"):
        argv_for("version: 1\nfilesystem_policy: {read_only: [/usr, /opt/to-proc]}\n")


# -------------------------------------- issue 11 finding 4: other tasks' scratch space, the host's shm


def test_another_tasks_tmpdir_is_refused():
    # Task A listing task B's TMPDIR (Grid Engine's /tmp/<job>.<task>.<queue>) reached B's proxy socket.
    for listed in ("/tmp/4243.1.all.q", "/tmp/tco-runner-1-0"):
        with pytest.raises(SandboxConfigError, match="inside /tmp, which holds other tasks' scratch space"):
            argv_for(f"version: 1\nfilesystem_policy: {{read_write: [/usr, {listed}]}}\n")


@pytest.mark.parametrize("listed", ["/run/shm", "/var/lock", "/dev/shm", "/run/lock", "/run", "/tmp"])
def test_shared_memory_and_lock_directories_are_always_the_sandboxs_own(listed):
    argv = argv_for(f"version: 1\nfilesystem_policy: {{read_only: [/usr], read_write: [{listed}]}}\n")
    assert (listed,) in pairs(argv, "--tmpfs")
    assert not [b for b in pairs(argv, "--bind") + pairs(argv, "--ro-bind")
                if b[1] == listed or b[0] in ("/dev/shm", "/run/lock", "/run", "/tmp")]
    # a fresh tmpfs of the plan's size: --size comes right before its --tmpfs
    at = argv.index(listed, argv.index("--tmpfs") - 1)
    assert argv[at - 3:at] == ["--size", str(plan_for(SYSTEM).limits.tmpfs_bytes), "--tmpfs"]


def test_tmpfs_size_and_process_limit_come_from_the_plan():
    argv = argv_for(SYSTEM, tmpfs_bytes=12345, max_processes=77)
    at = argv.index("/tmp", argv.index("--tmpfs") - 1)
    assert argv[at - 3:at] == ["--size", "12345", "--tmpfs"]
    relay = len(argv) - 1 - argv[::-1].index("/run/tco-relay.py")
    tail = argv[relay:]
    assert tail[tail.index("--max-processes") + 1] == "77"
    with pytest.raises(SandboxConfigError):
        argv_for(SYSTEM, max_processes=0)


# ------------------------------------------- issue 11 finding 8: the launch form's check is the runner's


def refusals_of(policy_text: str, **kw) -> list[str]:
    from execution.sandbox.checks import refusals

    return refusals(policy_text, masked_paths=["/spool", "/secrets.json", "/tmp/tco-runner-1-0"],
                    state_paths=["/var/lib/tco"], fs=FakeFS(), **kw)


def test_refusals_names_every_reason_and_accepts_a_plain_policy():
    assert refusals_of(SYSTEM) == []
    reasons = refusals_of("version: 1\nfilesystem_policy:\n  read_only: [/usr, /opt/to-proc, /spool/work]\n"
                          "  read_write: [/var/lib/tco/secret_key, /tmp/4243.1.all.q, /run/tco]\n")
    assert len(reasons) == 5, reasons
    assert reasons[0].startswith("filesystem_policy.read_only: /opt/to-proc (it resolves to /proc/1/root)")
    assert reasons[1].startswith("filesystem_policy.read_only: /spool/work is inside /spool")
    assert reasons[2].startswith("filesystem_policy.read_write: /var/lib/tco/secret_key is inside /var/lib/tco")
    assert reasons[3].startswith("filesystem_policy.read_write: /tmp/4243.1.all.q is inside /tmp")
    assert reasons[4].startswith("filesystem_policy.read_write: /run/tco is where tco puts its relay")


def test_refusals_include_what_bubblewrap_cannot_enforce_and_invalid_policies():
    policy = ("version: 1\nnetwork_policies:\n  api:\n    endpoints:\n      - {host: a.example.com, port: 443, "
              "protocol: rest, rules: [{allow: {method: GET, path: /}}], deny_rules: [{method: GET, path: /x}]}\n"
              "    binaries: [{path: /usr/bin/python3}]\n")
    [reason] = refusals_of(policy)
    assert "deny_rules: not enforced by the metering proxy" in reason
    assert refusals_of(policy, runtime="openshell") == []  # OpenShell enforces it itself
    assert refusals_of("version: 1\nfilesystem_policy: {read_onyl: [/usr]}\n") == [
        "filesystem_policy.read_onyl: unknown field (did you mean 'read_only'?)"]
    # A one-line path would make load_policy read that file (e.g. the credentials): never here.
    assert refusals_of("/spool/credentials.json") == ["policy: expected the policy's YAML text, not a file path"]


def test_refusals_name_a_relay_interpreter_the_policy_does_not_show():
    """The launch side refused nothing for a policy without /usr; the runner then raised at run time."""
    policy = "version: 1\nfilesystem_policy: {read_only: [/etc]}\n"
    message = ("the relay runs /usr/bin/python3.11 inside the sandbox: list its directory "
               "(for example /usr) in filesystem_policy.read_only")
    assert refusals_of(policy, interpreter="/usr/bin/python3") == [message]
    with pytest.raises(SandboxConfigError) as caught:
        argv_for(policy)
    assert str(caught.value) == message  # the same words as the runner's
    assert refusals_of(SYSTEM, interpreter="/usr/bin/python3") == []
    # Listing /usr is enough (the interpreter is /usr/bin/python3.11, shown at its own path).
    assert refusals_of("version: 1\nfilesystem_policy: {read_only: [/usr, /etc]}\n",
                       interpreter="/usr/bin/python3") == []


def test_every_path_refusal_is_also_what_the_argv_builder_raises():
    # The same function decides both: each path refusals() names makes build_argv refuse too.
    for path in ("/opt/to-proc", "/spool/work", "/var/lib/tco/secret_key", "/tmp/4243.1.all.q", "/run/tco",
                 "/mnt/spool-again/work", "/opt/to-state"):
        policy = f"version: 1\nfilesystem_policy: {{read_only: [/usr, {path}]}}\n"
        [reason] = refusals_of(policy)
        with pytest.raises(SandboxConfigError) as caught:
            build_argv(plan_for(policy, state=["/var/lib/tco"]), FakeFS())
        assert reason == str(caught.value).replace("filesystem_policy:", "filesystem_policy.read_only:", 1)


def test_mountinfo_aliases_are_found():
    from execution.sandbox.paths import HostFS

    class Mounts(HostFS):
        def mounts(self):
            return [("254:0", "/", "/"), ("254:0", "/srv/data", "/mnt/data"), ("0:5", "/", "/mnt/other"),
                    ("254:0", "/srv/data/state", "/opt/state dir")]

    fs = Mounts()
    assert fs.mount_aliases("/srv/data/state/secret_key") == ["/mnt/data/state/secret_key",
                                                              "/opt/state dir/secret_key"]
    assert fs.mount_aliases("/mnt/other/x") == []
    from execution.sandbox.paths import unescape_mountinfo
    assert unescape_mountinfo("/opt/state\\040dir\\134x") == "/opt/state dir\\x"
    assert any(point == "/" for _, _, point in HostFS().mounts())  # this host's own mountinfo


def test_under_openshell_a_binding_on_an_unregistered_endpoint_is_refused():
    # OpenShell injects a provider's credential wherever the policy binds it: the issue's attack
    # (a binding on the launcher's own port) must not reach it.
    policy = ("version: 1\nnetwork_policies:\n  m:\n    endpoints:\n"
              "      - {host: api.anthropic.com, port: 443, protocol: rest, credential_binding: {provider: anthropic},"
              " rules: [{allow: {method: POST, path: /v1/messages}}]}\n"
              "      - {host: evil.example.com, port: 8443, protocol: rest, credential_binding: {provider: anthropic},"
              " rules: [{allow: {method: POST, path: /v1/messages}}]}\n"
              "    binaries: [{path: /usr/bin/python3}]\n")
    registered = [{"host": "API.anthropic.com", "port": 443}]
    [reason] = refusals_of(policy, runtime="openshell", registered=registered)
    assert reason.startswith("network_policies.m.endpoints[1].credential_binding: evil.example.com:8443 is not a "
                             "registered model endpoint")
    assert refusals_of(policy, runtime="bubblewrap", registered=registered) == []  # the proxy adds none there


def test_read_only_tmpfs_are_made_read_only_after_the_mounts_inside_them():
    # /run listed read-only: bubblewrap must still make /run/tco and /run/tco-relay.py inside it.
    argv = argv_for("version: 1\nfilesystem_policy: {read_only: [/usr, /run, /var]}\n")
    assert ("/run",) in pairs(argv, "--tmpfs") and ("/var/tmp",) in pairs(argv, "--tmpfs")
    last_mount = max(i for i, a in enumerate(argv) if a in ("--ro-bind", "--bind", "--tmpfs", "--ro-bind-data",
                                                           "--symlink"))
    remounts = [i for i, a in enumerate(argv) if a == "--remount-ro" and argv[i + 1] in ("/run", "/var/tmp")]
    assert len(remounts) == 2 and min(remounts) > last_mount
