"""The sandbox policy's schema: fields, enumerations and limits (OpenShell's "Policy Schema Reference").

Standard library only.
"""
from __future__ import annotations

import re

MAX_POLICY_BYTES = 4 * 1024 * 1024
MAX_PATHS = 256
MAX_PATH_BYTES = 4096
MAX_MIDDLEWARES = 10
MAX_ID = 4294967294
SANDBOX_UID = 1000  # what ``run_as_user: sandbox`` means inside the user namespace

PROTOCOLS = ("rest", "websocket", "graphql", "mcp", "json-rpc", "tcp")
REQUEST_PROTOCOLS = ("rest", "websocket", "graphql", "mcp", "json-rpc")
ENFORCEMENTS = ("enforce", "audit")
ACCESS_PRESETS = ("read-only", "read-write", "full")
TLS_MODES = ("skip", "terminate")
COMPATIBILITY = ("best_effort", "hard_requirement")
SIGNING = ("sigv4", "sigv4:body", "sigv4:no_body")
MCP_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28")
ON_ERROR = ("fail_closed", "fail_open")

ACCESS_METHODS = {
    "read-only": ("GET", "HEAD", "OPTIONS"),
    "read-write": ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH"),
    "full": ("*",),
}

TOP_FIELDS = ("version", "filesystem_policy", "landlock", "process", "network_policies", "network_middlewares")
FILESYSTEM_FIELDS = ("include_workdir", "read_only", "read_write")
LANDLOCK_FIELDS = ("compatibility",)
PROCESS_FIELDS = ("run_as_user", "run_as_group")
RULE_FIELDS = ("name", "endpoints", "binaries")
ENDPOINT_FIELDS = (
    "host", "port", "ports", "path", "allowed_ips",
    "protocol", "tls", "enforcement", "access", "rules", "deny_rules", "allow_encoded_slash",
    "credential_binding", "request_body_credential_rewrite", "websocket_credential_rewrite",
    "allow_uninspected_credentials", "credential_signing", "signing_service", "signing_region",
    "persisted_queries", "graphql_persisted_queries", "graphql_max_body_bytes", "mcp", "json_rpc",
)
REQUEST_FIELDS = ("path", "enforcement", "access", "rules", "deny_rules", "allow_encoded_slash",
                  "request_body_credential_rewrite", "websocket_credential_rewrite", "credential_signing",
                  "signing_service", "signing_region", "persisted_queries", "graphql_persisted_queries",
                  "graphql_max_body_bytes", "mcp", "json_rpc")
MATCHER_FIELDS = {
    "rest": ("method", "path", "query"),
    "websocket": ("method", "path", "query"),
    "graphql": ("operation_type", "operation_name", "fields"),
    "mcp": ("method", "tool", "params"),
    "json-rpc": ("method",),
}
MIDDLEWARE_FIELDS = ("middleware", "endpoints", "order", "config", "on_error", "name")
TRIVIAL_ENDPOINT_PATHS = ("", "**", "/**")
METHOD_RE = re.compile(r"^(\*|[A-Za-z][A-Za-z_-]{0,31})$")
LABEL_RE = re.compile(r"^[A-Za-z0-9*]([A-Za-z0-9*-]{0,61}[A-Za-z0-9*])?$")
