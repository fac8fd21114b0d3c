"""tco's code in a scratch directory (a clone in /tmp): its bundled agents still run.

`git clone ... /tmp/x && cd /tmp/x && make demo` stopped at the demo campaign with "sandbox policy
wider than allowed: filesystem_policy.read_only: /tmp/x/demo is inside /tmp ...": the demo agent's
policy lists tco's own demo/ and venv read-only, and the check refuses every path inside the host's
/tmp (other tasks' scratch space). Read-only paths inside tco's own code directory
(execution.sandbox.paths.CODE_ROOT) are let through that one rule; everything else still applies.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from execution.sandbox.bwrap import SandboxConfigError, build_argv
from execution.sandbox.checks import refusals
from execution.sandbox.paths import CODE_ROOT
from execution.sandbox.plan import HiddenPaths, SandboxFds, SandboxPlan
from execution.sandbox.policy.load import load_policy

X = "/tmp/x"  # the clone


class CloneInTmp:
    """A Debian 12 host (merged /usr) with a clone of tco in /tmp/x, its state in /tmp/x/var, and
    another task's scratch directory in /tmp."""

    links = {"/bin": "usr/bin", "/lib": "usr/lib", f"{X}/demo/escape": "tmp/4243.1.all.q",
             f"{X}/.venv/bin/python": "usr/bin/python3"}
    dirs = {"/", "/usr", "/usr/bin", "/usr/lib", "/etc", "/tmp", "/tmp/4243.1.all.q", "/tmp/tco-runner-1-0",
            "/tmp/7.1.agent.q", "/tmp/7.1.agent.q/tco-runner-1-0",
            X, f"{X}/demo", f"{X}/.venv", f"{X}/.venv/bin", f"{X}/var", f"{X}/var/spool", f"{X}/var/spool/work",
            f"{X}/var/sweeps", f"{X}/var/sweeps/research", f"{X}/var/sweeps/engineering"}
    files = {"/usr/bin/python3.11", "/etc/resolv.conf", f"{X}/var/secret_key"}

    def mount_aliases(self, path):
        return []

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
                return self.realpath("/" + target + path[len(link):])
        return "/usr/bin/python3.11" if path == "/usr/bin/python3" else path


def plan_for(policy_text: str, code_root: str = X) -> SandboxPlan:
    return SandboxPlan(policy=load_policy(policy_text), workdir=f"{X}/var/spool/work",
                       socket_dir="/tmp/7.1.agent.q/tco-runner-1-0",
                       agent_argv=[f"{X}/.venv/bin/python", "-m", "demo.demo_agent"], env={},
                       interpreter=f"{X}/.venv/bin/python", fds=SandboxFds(status=3, json_status=4, stdout=5, stderr=6,
                                                                             data={"/run/tco-relay.py": 7}),
                       hidden=HiddenPaths(masks=tuple(MASKS), state=(f"{X}/var",), shared=(f"{X}/var/sweeps",)),
                       code_root=code_root)


def pairs(argv: list[str], flag: str) -> list[tuple[str, ...]]:
    width = {"--ro-bind": 2, "--bind": 2, "--tmpfs": 1}[flag]
    return [tuple(argv[i + 1:i + 1 + width]) for i, a in enumerate(argv) if a == flag]


def mount_order(argv: list[str]) -> list[str]:
    """Destinations of mount operations, in order."""
    out = []
    for i, a in enumerate(argv):
        if a in ("--ro-bind", "--bind", "--symlink", "--ro-bind-data"):
            out.append(argv[i + 2])
        elif a in ("--tmpfs", "--proc", "--dev"):
            out.append(argv[i + 1])
    return out


def demo_policy(*extra_read_only: str, read_write: str = "/sandbox, /tmp") -> str:
    """What tco_bootstrap's demo ceiling and the runner's default policy list, for the clone."""
    read_only = ["/usr", "/lib", "/etc", f"{X}/demo", f"{X}/.venv", f"{X}/var/sweeps/research", *extra_read_only]
    return (f"version: 1\nfilesystem_policy:\n  include_workdir: true\n  read_only: [{', '.join(read_only)}]\n"
            f"  read_write: [{read_write}]\n")


#: What the runner of task 1 of job 7 masks at run time (execution.runner.task.sandbox_paths): the
#: spool, its private directory, Grid Engine's TMPDIR for the task and /tmp, which holds every job's.
MASKS = [f"{X}/var/spool", "/tmp/7.1.agent.q/tco-runner-1-0", "/tmp/7.1.agent.q", "/tmp"]


def check(policy_text: str, code_root: str | None = X) -> list[str]:
    return refusals(policy_text, masked_paths=MASKS,
                    state_paths=[f"{X}/var"], shared_paths=[f"{X}/var/sweeps"],
                    interpreter=f"{X}/.venv/bin/python", fs=CloneInTmp(), code_root=code_root)


def test_the_demo_policy_of_a_clone_in_tmp_was_refused_for_its_own_code():
    # The failure as the fresh-clone trial saw it: tco's code anywhere but the clone.
    reasons = check(demo_policy(), code_root="/opt/tco")
    assert reasons[0].startswith(f"filesystem_policy.read_only: {X}/demo is inside /tmp, which holds other "
                                 "tasks' scratch space")
    assert len(reasons) == 3  # demo/, .venv and the team's sweeps


def test_the_demo_policy_of_a_clone_in_tmp_passes_when_the_code_is_there():
    assert check(demo_policy()) == []


def test_read_write_inside_the_code_directory_in_tmp_is_still_refused():
    [reason] = check(demo_policy(read_write=f"/sandbox, /tmp, {X}/demo"))
    assert reason.startswith(f"filesystem_policy.read_write: {X}/demo is inside /tmp")


def test_other_scratch_space_in_tmp_is_still_refused_beside_the_clone():
    [reason] = check(demo_policy("/tmp/4243.1.all.q"))
    assert reason.startswith("filesystem_policy.read_only: /tmp/4243.1.all.q is inside /tmp")


def test_a_link_in_the_code_directory_to_other_scratch_space_is_refused():
    [reason] = check(demo_policy(f"{X}/demo/escape"))
    assert reason.startswith(f"filesystem_policy.read_only: {X}/demo/escape is inside /tmp")


def test_the_state_directory_inside_the_clone_stays_hidden():
    reasons = check(demo_policy(f"{X}/var/secret_key", f"{X}/var/spool"))
    assert [r.split(" is inside ")[0] for r in reasons] == [
        f"filesystem_policy.read_only: {X}/var/secret_key", f"filesystem_policy.read_only: {X}/var/spool"]
    assert all("which holds tco's own files" in r for r in reasons)
    # Listing the whole clone read-only is allowed, with its state directory covered inside.
    assert check(demo_policy(X)) == []
    argv = build_argv(plan_for(demo_policy(X)), CloneInTmp())
    assert (f"{X}/var",) in pairs(argv, "--tmpfs")


def test_the_sandbox_binds_the_code_over_its_own_tmp():
    argv = build_argv(plan_for(demo_policy()), CloneInTmp())
    assert ("/tmp",) in pairs(argv, "--tmpfs")  # the sandbox's own /tmp, never the host's
    for path in (f"{X}/demo", f"{X}/.venv", f"{X}/var/sweeps/research"):
        assert (path, path) in pairs(argv, "--ro-bind")
        assert (path, path) not in pairs(argv, "--bind")
    order = mount_order(argv)
    assert order.index("/tmp") < order.index(f"{X}/demo")  # bound onto the fresh tmpfs, not hidden by it
    with pytest.raises(SandboxConfigError, match=f"{X}/demo is inside /tmp"):
        build_argv(plan_for(demo_policy(), code_root="/opt/tco"), CloneInTmp())


def test_the_code_root_is_this_repository():
    assert CODE_ROOT == os.path.realpath(Path(__file__).resolve().parents[2])


PROBE = r"""
import json, os, sys
from execution.runner.config import default_policy
from execution.runner.task import sandbox_paths
from execution.sandbox.bwrap import build_argv
from execution.sandbox.checks import refusals
from execution.sandbox.paths import CODE_ROOT
from execution.sandbox.plan import HiddenPaths, SandboxFds, SandboxPlan
from execution.sandbox.policy.load import load_policy
state = os.path.join(CODE_ROOT, "var")
# The runner's own masks for task 1 of job 7 with Grid Engine's TMPDIR (/tmp/7.1.agent.q, so /tmp too).
spool = os.path.join(state, "spool")
paths = sandbox_paths({"JOB_ID": "7", "TMPDIR": "/tmp/7.1.agent.q", "TCO_SANDBOX_MASK": state,
                       "TCO_SANDBOX_SHARED": os.path.join(state, "sweeps")}, spool)
policy = default_policy()
reasons = refusals(policy, masked_paths=paths["masked"], state_paths=paths["state"], shared_paths=paths["shared"],
                   interpreter=sys.executable)
argv = []
if not reasons:
    plan = SandboxPlan(policy=load_policy(policy), workdir=spool, socket_dir=spool, agent_argv=["true"], env={},
                       interpreter=sys.executable,
                       fds=SandboxFds(status=3, json_status=4, stdout=5, stderr=6, data={"/run/tco-relay.py": 7}),
                       hidden=HiddenPaths(masks=tuple(paths["masked"]), state=tuple(paths["state"]),
                                          shared=tuple(paths["shared"])))
    argv = build_argv(plan)
print(json.dumps({"code_root": CODE_ROOT, "masked": paths["masked"], "read_only": policy["filesystem_policy"]["read_only"],
                  "reasons": reasons, "argv": argv}))
"""


def test_a_copy_of_the_runner_in_tmp_accepts_its_own_default_policy(tmp_path):
    """The real thing on the real host: tco's execution package copied into a directory under the
    host's /tmp (pytest's tmp_path), its runner's default policy (the demo agent's) checked there."""
    repo = Path(CODE_ROOT)
    clone = tmp_path / "x"
    if not str(clone.resolve()).startswith("/tmp/"):
        pytest.skip(f"tmp_path {clone} is not under /tmp")
    if Path(sys.prefix).resolve().is_relative_to("/tmp"):
        # A checkout under /tmp runs its runner with its own .venv, inside its code root (which the policy
        # allows); this copy holds execution/ alone, so the tests' interpreter would be a second tree under
        # /tmp that no real install has (seen by a fresh clone in /tmp: the check refused its .venv).
        pytest.skip(f"the tests' interpreter ({sys.prefix}) is under /tmp, outside the copy")
    shutil.copytree(repo / "execution", clone / "execution", ignore=shutil.ignore_patterns("__pycache__"))
    (clone / "demo").mkdir()
    (clone / "var" / "spool").mkdir(parents=True)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=clone, env={**os.environ, "PYTHONPATH": str(clone)},
                         capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(out.stdout)
    assert seen["code_root"] == str(clone.resolve())
    assert "/tmp" in seen["masked"]  # Grid Engine's TMPDIRs' directory, masked by the runner
    assert str(clone.resolve() / "demo") in seen["read_only"]
    assert seen["reasons"] == []
    demo = str(clone.resolve() / "demo")
    assert ["--ro-bind", demo, demo] in [seen["argv"][i:i + 3] for i in range(len(seen["argv"]) - 2)]
