"""execution/sandbox/ceiling.py: a campaign's policy may only narrow an admin's ceiling (issue 11, finding 2).

Pure: policies are loaded with the runner's validator and compared; no Django.
"""
from __future__ import annotations

import pytest

from execution.sandbox.ceiling import narrowing_problems, path_within
from execution.sandbox.policy.load import load_policy

CEILING = """
version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /etc, /srv/tco/demo, /srv/data/sweeps]
  read_write: [/sandbox, /tmp]
process: {run_as_user: sandbox, run_as_group: sandbox}
network_policies:
  model_api:
    endpoints:
      - host: api.example.com
        port: 443
        protocol: rest
        enforcement: enforce
        credential_binding: {provider: anthropic}
        rules: [{allow: {method: POST, path: /v1/messages}}, {allow: {method: GET, path: /v1/models/**}}]
    binaries: [{path: /usr/bin/python3}]
"""

NARROW = """
version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr/lib, /srv/data/sweeps/run-7]
  read_write: [/sandbox]
process: {run_as_user: sandbox}
network_policies:
  model_api:
    endpoints:
      - host: API.example.com
        port: 443
        protocol: rest
        enforcement: enforce
        credential_binding: {provider: anthropic}
        rules: [{allow: {method: POST, path: /v1/messages}}, {allow: {method: GET, path: /v1/models/claude}}]
    binaries: [{path: /usr/bin/python3}]
"""


def problems(policy_text: str, ceiling_text: str = CEILING) -> list[str]:
    return narrowing_problems(load_policy(policy_text), load_policy(ceiling_text))


def test_a_policy_inside_the_ceiling_fits():
    assert problems(NARROW) == []
    assert problems("version: 1\nfilesystem_policy: {read_only: [/etc/ssl]}\n") == []


def test_the_ceiling_fits_itself():
    assert problems(CEILING) == []


@pytest.mark.parametrize("path", ["/srv/tco/var/secret_key", "/srv/tco/var", "/srv/tco", "/", "/usrx",
                                  "/srv/data/sweeps-other", "/home"])
def test_read_only_paths_outside_the_ceiling_are_refused(path):
    found = problems(f"version: 1\nfilesystem_policy: {{read_only: [{path}]}}\n")
    assert found == [f"filesystem_policy.read_only: {path} is outside the ceiling's paths"]


def test_read_write_needs_a_read_write_path_of_the_ceiling():
    found = problems("version: 1\nfilesystem_policy: {read_write: [/etc, /sandbox/x]}\n")
    assert found == ["filesystem_policy.read_write: /etc is outside the ceiling's read_write paths"]


def test_the_work_directory_only_where_the_ceiling_has_it():
    ceiling = "version: 1\nfilesystem_policy: {include_workdir: false, read_only: [/usr]}\n"
    assert problems("version: 1\nfilesystem_policy: {include_workdir: true}\n", ceiling) == [
        "filesystem_policy.include_workdir: the ceiling does not include the work directory"]


def test_the_reported_attack_an_own_endpoint_with_the_sites_credential_is_refused():
    # issue 11, finding 2: an endpoint on a port of the launcher's own, binding the site's provider.
    attack = """
version: 1
filesystem_policy: {read_only: [/srv/tco/var/secret_key, /srv/tco/var/admin-password]}
network_policies:
  steal:
    endpoints:
      - {host: 127.0.0.1, port: 9999, protocol: rest, enforcement: enforce,
         credential_binding: {provider: anthropic}, rules: [{allow: {method: POST, path: /v1/messages}}]}
    binaries: [{path: /usr/bin/python3}]
"""
    found = problems(attack)
    assert "filesystem_policy.read_only: /srv/tco/var/secret_key is outside the ceiling's paths" in found
    assert "filesystem_policy.read_only: /srv/tco/var/admin-password is outside the ceiling's paths" in found
    assert any(p.startswith("network_policies.steal.endpoints[0]: 127.0.0.1 (rest) is not an endpoint") for p in found)


def _endpoint(**overrides) -> str:
    fields = {"host": "api.example.com", "port": "443", "protocol": "rest", "enforcement": "enforce",
              "credential_binding": "{provider: anthropic}", "rules": "[{allow: {method: POST, path: /v1/messages}}]"}
    fields.update(overrides)
    body = ", ".join(f"{k}: {v}" for k, v in fields.items() if v is not None)
    return ("version: 1\nnetwork_policies:\n  model_api:\n    endpoints:\n"
            f"      - {{{body}}}\n    binaries: [{{path: /usr/bin/python3}}]\n")


@pytest.mark.parametrize("overrides, expected", [
    ({"port": "8443"}, "port 8443 of api.example.com is not allowed"),
    ({"host": "api.example.org"}, "api.example.org (rest) is not an endpoint the ceiling allows"),
    ({"credential_binding": "{provider: openai}"}, "credential_binding 'openai' differs"),
    ({"credential_binding": None}, "credential_binding None differs"),
    ({"enforcement": "audit"}, "enforcement: audit is wider"),
    ({"rules": "[{allow: {method: '*', path: /v1/messages}}]"}, "rule * /v1/messages is not allowed"),
    ({"rules": "[{allow: {method: POST, path: /v1/files}}]"}, "rule POST /v1/files is not allowed"),
    ({"rules": "[{allow: {method: GET, path: /v1/**}}]"}, "rule GET /v1/** is not allowed"),
    ({"rules": None, "access": "full"}, "rule * /** is not allowed"),
])
def test_each_network_widening_is_named(overrides, expected):
    found = problems(_endpoint(**overrides))
    assert len(found) >= 1 and any(expected in p for p in found), found


def test_an_endpoint_without_enforcement_is_told_it_defaults_to_audit():
    """The launcher never wrote "audit" and was told "enforcement: audit is wider"."""
    [found] = problems(_endpoint(enforcement=None))
    assert found.endswith("enforcement: not set, so it is audit (OpenShell's default: requests the rules do not "
                          "allow are logged, not refused), wider than the ceiling's enforce; "
                          "write enforcement: enforce"), found


def test_rules_under_a_ceiling_glob_fit():
    assert problems(_endpoint(rules="[{allow: {method: GET, path: /v1/models/x/**}}]")) == []
    assert problems(_endpoint(rules="[{allow: {method: GET, path: /v1/models/**}}]")) == []


def test_binaries_the_ceiling_does_not_list_are_refused():
    text = _endpoint().replace("/usr/bin/python3", "/usr/bin/curl")
    assert problems(text) == ["network_policies.model_api.endpoints[0] (port 443): binaries /usr/bin/curl are not "
                              "in the ceiling's rule"]


def test_process_identity_and_landlock_cannot_be_widened():
    assert problems("version: 1\nprocess: {run_as_user: '1000'}\n") == []  # 'sandbox' is uid 1000
    assert problems("version: 1\nprocess: {run_as_user: '4242'}\n") == [
        "process.run_as_user: '4242' differs from the ceiling's 'sandbox'"]
    strict = CEILING + "landlock: {compatibility: hard_requirement}\n"
    assert problems("version: 1\n", strict) == ["landlock.compatibility: the ceiling requires hard_requirement"]


def test_a_ceiling_without_network_allows_no_endpoint():
    found = problems(NARROW, "version: 1\nfilesystem_policy: {include_workdir: true, read_only: [/], "
                             "read_write: [/sandbox]}\n")
    assert len(found) == 1 and "is not an endpoint the ceiling allows" in found[0]


def test_a_ceilings_private_tmp_does_not_cover_the_hosts_tmp_below_it():
    # /tmp in a policy is the sandbox's own tmpfs; /tmp/x would bind the host's /tmp/x (another
    # task's scratch space, issue 11 finding 4), so the ceiling's /tmp must not allow it.
    assert problems("version: 1\nfilesystem_policy: {read_write: [/tmp]}\n") == []
    assert problems("version: 1\nfilesystem_policy: {read_only: [/tmp/other-task]}\n") == [
        "filesystem_policy.read_only: /tmp/other-task is outside the ceiling's paths"]
    assert not path_within("/run/shm", ["/run"]) and path_within("/run", ["/run"])


def test_path_within_compares_on_component_boundaries():
    assert path_within("/a/b", ["/a"]) and path_within("/a", ["/a/"]) and path_within("/x", ["/"])
    assert not path_within("/ab", ["/a"]) and not path_within("/", ["/a"])
