"""The sandbox policy: YAML in OpenShell's own schema, loaded strictly.

One file serves both runtimes (DESIGN.md, "Sandbox policy"). The schema is
OpenShell's "Policy Schema Reference": ``version``, ``filesystem_policy``,
``landlock``, ``process``, ``network_policies`` and ``network_middlewares``.
Like OpenShell, :func:`~.load.load_policy` rejects unknown fields (with a
"did you mean" hint) and duplicate keys (with both line numbers), and checks types,
enumerations and the documented constraints (absolute paths without ``..``,
at most 256 of them, ``read_write`` never ``/``, ``run_as_user`` never root,
``access`` xor ``rules``, wildcard host shapes, ...). Every problem found is
reported at once in one :class:`~.model.PolicyError`, each naming its field.

Some fields have no bubblewrap equivalent. :meth:`~.model.Policy.unenforceable` says
which, as :class:`Finding` messages: a *note* where the bubblewrap runtime
does something different but never allows more than the policy (for
example ``binaries``, which cannot be checked through the relay, or
``run_as_user``, which is a uid inside the user namespace); a *refusal*
where enforcing less would allow more than the policy says (``deny_rules``,
query matchers, ``allowed_ips``, middlewares): the runner then refuses to
start the agent rather than run it under a weaker policy.

:meth:`~.model.Policy.proxy_policy` is the network part as the metering proxy
(execution/metering/proxy.py) takes it: only endpoints it can reach and meter
(``protocol: rest``, an exact host, a rule that lists binaries), ``ports``
expanded, ``access`` presets expanded to rules.

The modules: ``model`` (:class:`~.model.Policy`, :class:`~.model.Endpoint`,
:class:`~.model.Finding`, :class:`~.model.PolicyError`), ``schema`` (the
fields, enumerations and limits), ``load`` (YAML and
:func:`~.load.load_policy`), ``validate`` (:func:`~.validate.validate_policy`),
``endpoint_checks`` (one network endpoint and its rules), ``checker`` (how a
problem is collected and named).
"""
