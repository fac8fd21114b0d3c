"""The agent's sandbox: its policy, and the two runtimes that enforce it.

- :mod:`execution.sandbox.policy`: the policy in OpenShell's schema (YAML),
  loaded strictly (unknown fields and duplicate keys are errors), and what the
  bubblewrap runtime cannot enforce.
- :mod:`execution.sandbox.bwrap`: the bubblewrap runtime (argv builder and the
  driver the runner uses).
- :mod:`execution.sandbox.relay`: runs inside the sandbox as its PID 1; listens
  on the sandbox's own loopback and passes each connection to the metering
  proxy's Unix socket, the sandbox's only way out.
- :mod:`execution.sandbox.openshell`: hands the same policy to OpenShell's CLI
  where ``openshell`` is installed.

Standard library only, except that loading YAML imports PyYAML; the runner
imports these modules, so they stay quick to import and free of Django.
"""


class SandboxStartError(RuntimeError):
    """The sandbox could not be built, or the agent could not be started in it; the
    message says why (both runtimes raise it)."""
