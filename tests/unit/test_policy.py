"""The sandbox policy loader: OpenShell's schema, strictly (execution/sandbox/policy/)."""
from __future__ import annotations

import pytest

from execution.sandbox.policy.load import load_policy
from execution.sandbox.policy.model import PolicyError
from execution.sandbox.policy.validate import validate_policy

DESIGN_EXAMPLE = """\
version: 1
filesystem_policy:            # paths not listed are inaccessible
  include_workdir: true
  read_only: [/usr, /lib, /etc]
  read_write: [/sandbox, /tmp]
landlock: {compatibility: best_effort}
process: {run_as_user: sandbox, run_as_group: sandbox}
network_policies:             # deny by default; named blocks
  model_api:
    endpoints:
      - host: api.anthropic.com
        port: 443
        protocol: rest        # without it, rules are not inspected
        enforcement: enforce  # the default is audit only
        credential_binding: {provider: anthropic}
        rules: [{allow: {method: POST, path: /v1/messages}}]
    binaries: [{path: /usr/bin/python3}]
"""


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as excinfo:
        load_policy(text)
    return excinfo.value.problems


def endpoint_policy(endpoint: str, binaries: str = "[{path: /usr/bin/python3}]") -> str:
    return f"version: 1\nnetwork_policies:\n  api:\n    endpoints:\n      - {endpoint}\n    binaries: {binaries}\n"


# --------------------------------------------------------------------------- valid policies

def test_the_design_example_loads():
    policy = load_policy(DESIGN_EXAMPLE)
    assert policy.read_only == ("/usr", "/lib", "/etc")
    assert policy.read_write == ("/sandbox", "/tmp")
    assert policy.include_workdir is True
    assert (policy.uid, policy.gid) == (1000, 1000)
    ((rule, endpoint),) = list(policy.endpoints())
    assert (rule.key, endpoint.host, endpoint.ports, endpoint.protocol, endpoint.enforcement) == (
        "model_api", "api.anthropic.com", (443,), "rest", "enforce")
    assert endpoint.credential_provider == "anthropic"
    assert rule.binaries == ("/usr/bin/python3",)
    assert policy.refusals() == []


def test_a_policy_file_path_loads(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(DESIGN_EXAMPLE)
    assert load_policy(str(path)).text == DESIGN_EXAMPLE


def test_a_parsed_mapping_loads():
    policy = validate_policy({"version": 1})
    assert policy.include_workdir is True  # no filesystem_policy: the work directory is included
    assert policy.read_only == () and policy.network == ()


def test_include_workdir_defaults_to_false_when_filesystem_policy_is_present():
    assert load_policy("version: 1\nfilesystem_policy: {read_only: [/usr]}\n").include_workdir is False


def test_numeric_ids_run_as_that_id_inside():
    policy = load_policy('version: 1\nprocess: {run_as_user: "1500", run_as_group: "1600"}\n')
    assert (policy.uid, policy.gid) == (1500, 1600)


def test_paths_are_normalised():
    policy = load_policy("version: 1\nfilesystem_policy: {read_only: [/usr/, /opt//tools/./bin]}\n")
    assert policy.read_only == ("/usr", "/opt/tools/bin")


# --------------------------------------------------------------------------- rejections

def test_unknown_fields_are_rejected_with_a_suggestion():
    found = problems("version: 1\nfilesystem_policy:\n  read_onyl: [/usr]\nnetwork_policy: {}\n")
    assert "filesystem_policy.read_onyl: unknown field (did you mean 'read_only'?)" in found
    assert "network_policy: unknown field (did you mean 'network_policies'?)" in found


def test_duplicate_keys_are_rejected_with_both_lines():
    found = problems("version: 1\nprocess:\n  run_as_user: sandbox\n  run_as_user: '1500'\n")
    assert found == ["line 4: duplicate key 'run_as_user' (first at line 3)"]


def test_duplicate_rule_names_are_rejected():
    text = endpoint_policy("{host: a.example.com, port: 443}") + "  api:\n    endpoints: []\n"
    assert problems(text)[0].startswith("line 7: duplicate key 'api' (first at line 3)")


def test_merge_keys_are_rejected():
    assert problems("version: 1\nx: &a {run_as_user: sandbox}\nprocess: {<<: *a}\n")[0] == \
        "line 3: YAML merge keys ('<<') are not allowed"


def test_every_problem_is_reported_at_once():
    found = problems("version: 2\nfilesystem_policy: {read_write: ['/'], read_only: [usr]}\n"
                     "process: {run_as_user: '0'}\nlandlock: {compatibility: strict}\n")
    assert found == [
        "version: 2 is not supported (must be 1)",
        "filesystem_policy.read_only[0]: 'usr' is not an absolute path",
        "filesystem_policy.read_write[0]: read_write cannot contain '/'",
        "landlock.compatibility: 'strict' is not one of best_effort, hard_requirement",
        "process.run_as_user: 0 is outside 1..4294967294 (root, 0, is never allowed)",
    ]


@pytest.mark.parametrize("text, expected", [
    ("filesystem_policy: {}\n", "version: required (version: 1)"),
    ("version: '1'\n", "version: expected the integer 1, got text ('1')"),
    ("version: true\n", "version: expected the integer 1, got a boolean (true)"),
    ("version: 1\nfilesystem_policy: {read_only: [/a/../etc]}\n", "filesystem_policy.read_only[0]: '/a/../etc' contains '..'"),
    ("version: 1\nfilesystem_policy: {include_workdir: yes please}\n",
     "filesystem_policy.include_workdir: expected true or false, got text ('yes please')"),
    ("version: 1\nprocess: {run_as_user: 1500}\n", "process.run_as_user: expected text: write the id in quotes ('1500')"),
    ("version: 1\nprocess: {run_as_group: wheel}\n", "process.run_as_group: 'wheel' must be 'sandbox' or a numeric id"),
])
def test_field_errors_name_the_field(text, expected):
    assert expected in problems(text)


def test_too_many_paths_are_rejected():
    paths = ", ".join(f"/p{i}" for i in range(257))
    assert "filesystem_policy: lists 257 paths; at most 256" in problems(
        f"version: 1\nfilesystem_policy: {{read_only: [{paths}]}}\n")


def test_a_huge_policy_is_rejected():
    assert problems("version: 1\n" + "#" * (4 * 1024 * 1024))[0].startswith("policy is larger than")


def test_invalid_yaml_says_where():
    assert problems("version: [1\n")[0].startswith("line 2: not valid YAML")


@pytest.mark.parametrize("endpoint, expected", [
    ("{host: a.example.com, port: 443, ports: [443]}", "set port or ports, not both"),
    ("{host: a.example.com}", "needs port (or ports)"),
    ("{port: 443}", "needs host (or allowed_ips)"),
    ("{host: a.example.com, port: 0}", "port: 0 is outside 1..65535"),
    ("{host: a.example.com, port: 443, protocol: http}", "protocol: 'http' is not one of"),
    ("{host: a.example.com, port: 443, protocol: rest}", "a rest endpoint needs access or rules"),
    ("{host: a.example.com, port: 443, protocol: rest, access: full, rules: []}", "access and rules cannot be combined"),
    ("{host: a.example.com, port: 443, protocol: rest, access: everything}", "access: 'everything' is not one of"),
    ("{host: a.example.com, port: 443, deny_rules: [{method: GET, path: /}]}", "deny_rules: require protocol"),
    ("{host: a.example.com, port: 443, protocol: tcp, path: /x}", "path: not accepted with protocol tcp"),
    ("{host: 10.0.0.1, port: 443, protocol: tcp}", "protocol tcp needs a host name"),
    ("{host: a.example.com, port: 443, protocol: rest, access: full, tls: skip}", "tls: skip relays TLS uninspected"),
    ("{host: '*.com', port: 443}", "wildcard host '*.com' needs at least three labels"),
    ("{host: 'api.**.example.com', port: 443}", "'**' is allowed only as the whole first label"),
    ("{host: a.example.com, port: 443, protocol: rest, rules: [{method: GET, path: /}]}",
     "each rule wraps its matcher in 'allow:'"),
    ("{host: a.example.com, port: 443, protocol: rest, rules: [{allow: {method: GET}}]}", "allow.path: required"),
    ("{host: a.example.com, port: 443, protocol: rest, rules: [{allow: {method: GET, path: /, tool: x}}]}",
     "allow.tool: unknown field"),
    ("{host: a.example.com, port: 443, protocol: websocket, rules: [{allow: {method: POST, path: /}}]}",
     "websocket rules use GET, WEBSOCKET_TEXT or '*'"),
    ("{host: a.example.com, port: 443, protocol: json-rpc, rules: [{allow: {method: 'reports.*'}}]}",
     "JSON-RPC methods are exact names or '*'"),
    ("{host: a.example.com, port: 443, credential_binding: {provider: x, key: y}}",
     "credential_binding.key: unknown field"),
    ("{host: a.example.com, port: 443, credential_signing: sigv4}", "signing_service: required with credential_signing"),
    ("{host: a.example.com, port: 443, allowed_ips: [not-an-ip]}", "'not-an-ip' is not an IP address or CIDR range"),
    ("{host: a.example.com, port: 443, protocol: mcp, mcp: {versions: ['2024-01-01']}}", "is not one of 2025-03-26"),
])
def test_endpoint_constraints(endpoint, expected):
    found = problems(endpoint_policy(endpoint))
    assert any(expected in p for p in found), found
    assert all(p.startswith("network_policies.api.endpoints[0]") for p in found)


def test_reserved_rule_keys_and_bad_binaries_are_rejected():
    found = problems("version: 1\nnetwork_policies:\n  _provider_x:\n    binaries: [{path: python3}, {}]\n")
    assert found == [
        "network_policies._provider_x: rule keys starting with '_provider_' are reserved for providers",
        "network_policies._provider_x.binaries[0].path: 'python3' is not an absolute path",
        "network_policies._provider_x.binaries[1].path: required",
    ]


def test_middleware_fields_are_checked():
    found = problems("version: 1\nnetwork_middlewares:\n  a: {middleware: x, endpoints: {include: ['*.e.com']}, order: 1}\n"
                     "  b: {endpoints: {exclude: []}, order: 1, on_error: maybe}\n")
    assert found == [
        "network_middlewares.b.middleware: required",
        "network_middlewares.b.endpoints.include: required",
        "network_middlewares.b.order: 1 is also the order of a (must be unique)",
        "network_middlewares.b.on_error: 'maybe' is not one of fail_closed, fail_open",
    ]


# --------------------------------------------------------------------------- what bubblewrap cannot enforce

def test_it_says_which_fields_bubblewrap_cannot_enforce():
    policy = load_policy(DESIGN_EXAMPLE)
    notes = {f.field: f.message for f in policy.unenforceable()}
    assert set(notes) == {"landlock", "process.run_as_user", "process.run_as_group", "network_policies.model_api.binaries"}
    assert "cannot tell which program opened them" in notes["network_policies.model_api.binaries"]
    assert "user namespace" in notes["process.run_as_user"]
    assert "mount namespace" in notes["landlock"]
    assert not any(f.refuse for f in policy.unenforceable())


@pytest.mark.parametrize("endpoint, field, refuse", [
    ("{host: a.example.com, port: 443, protocol: rest, rules: [{allow: {method: GET, path: /}}], deny_rules: [{method: GET, path: /x}]}",
     "deny_rules", True),
    ("{host: a.example.com, port: 443, protocol: rest, rules: [{allow: {method: GET, path: /, query: {a: b}}}]}", "rules", True),
    ("{host: a.example.com, port: 443, protocol: rest, access: full, allowed_ips: [10.0.0.0/8]}", "allowed_ips", True),
    ("{host: a.example.com, port: 443, protocol: rest, access: full, path: /v1/**}", "path", True),
    ("{host: a.example.com, port: 443, protocol: rest, access: full}", "enforcement", False),
    ("{host: a.example.com, port: 443, protocol: rest, access: full, request_body_credential_rewrite: true}",
     "request_body_credential_rewrite", False),
])
def test_fields_the_proxy_cannot_enforce_are_notes_or_refusals(endpoint, field, refuse):
    findings = load_policy(endpoint_policy(endpoint)).unenforceable()
    matching = [f for f in findings if f.field == f"network_policies.api.endpoints[0].{field}"]
    assert matching and matching[0].refuse is refuse, findings


def test_an_endpoint_without_enforcement_is_told_plainly_what_the_default_is_and_why():
    """The note read "audit (the default) is enforced anyway": it did not say the field was
    missing, what audit does, nor what the bubblewrap runtime does instead."""
    unset = load_policy(endpoint_policy("{host: a.example.com, port: 443, protocol: rest, access: read-only}"))
    [note] = [f.message for f in unset.unenforceable() if f.field.endswith(".enforcement")]
    assert note.startswith("not set, so OpenShell's default applies: audit"), note
    assert "logged but not refused" in note and "the metering proxy refuses them" in note
    assert "enforcement: enforce" in note  # what to write to say so
    written = load_policy(endpoint_policy(
        "{host: a.example.com, port: 443, protocol: rest, access: read-only, enforcement: audit}"))
    [note] = [f.message for f in written.unenforceable() if f.field.endswith(".enforcement")]
    assert note.startswith("audit: OpenShell logs but does not refuse"), note
    enforced = load_policy(endpoint_policy(
        "{host: a.example.com, port: 443, protocol: rest, access: read-only, enforcement: enforce}"))
    assert not [f for f in enforced.unenforceable() if f.field.endswith(".enforcement")]


def test_uninspected_endpoints_are_not_reachable():
    policy = load_policy(endpoint_policy("{host: a.example.com, port: 443}"))
    (finding,) = [f for f in policy.unenforceable() if f.field == "network_policies.api.endpoints[0]"]
    assert "not reachable" in finding.message and not finding.refuse
    assert policy.proxy_policy() == {"network_policies": {}}


def test_a_rule_without_binaries_reaches_nothing():
    policy = load_policy(endpoint_policy("{host: a.example.com, port: 443, protocol: rest, access: full}", "[]"))
    assert "allows no program" in str(policy.unenforceable()[-1])
    assert policy.proxy_policy() == {"network_policies": {}}


def test_middleware_is_refused():
    policy = load_policy("version: 1\nnetwork_middlewares:\n  r: {middleware: x, endpoints: {include: ['*.e.com']}}\n")
    assert [f.field for f in policy.refusals()] == ["network_middlewares.r"]


def test_loopback_endpoints_are_flagged_for_openshell():
    policy = load_policy(endpoint_policy("{host: 127.0.0.1, port: 8123, protocol: rest, enforcement: enforce, "
                                         "rules: [{allow: {method: POST, path: /v1/messages}}]}"))
    assert any("OpenShell refuses loopback" in f.message for f in policy.unenforceable())


def test_the_proxy_gets_reachable_endpoints_with_ports_and_presets_expanded():
    policy = load_policy(endpoint_policy(
        "{host: api.example.com, ports: [443, 8443], protocol: rest, access: read-only, credential_binding: {provider: p}}"))
    blocks = policy.proxy_policy()["network_policies"]
    assert [(e["host"], e["port"]) for e in blocks["api"]["endpoints"]] == [("api.example.com", 443),
                                                                            ("api.example.com", 8443)]
    assert blocks["api"]["endpoints"][0]["rules"] == [{"allow": {"method": m, "path": "/**"}}
                                                      for m in ("GET", "HEAD", "OPTIONS")]
    assert blocks["api"]["endpoints"][0]["credential_binding"] == {"provider": "p"}
    assert policy.credential_providers() == {"p"}


def test_the_proxy_policy_is_accepted_by_the_metering_proxy():
    pytest.importorskip("aiohttp")
    from execution.metering.endpoints import endpoints_from_policy

    (endpoint,) = endpoints_from_policy(load_policy(DESIGN_EXAMPLE).proxy_policy())
    assert (endpoint.host, endpoint.port, endpoint.credential) == ("api.anthropic.com", 443, "anthropic")
    assert endpoint.allows("POST", "/v1/messages") and not endpoint.allows("GET", "/v1/messages")
