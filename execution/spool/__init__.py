"""The spool contract: what the web side and the execution hosts exchange through the spool directory.

Standard library only, no Django: the runner (``execution/runner/``) imports
it on every execution host, and the web side (the launch writes specs,
ingest reads records) imports the same package, so both sides agree on one
layout and one set of versioned types.

The modules: ``contract`` (versions, stage and token names, the errors),
``layout`` (:class:`~.layout.SpoolLayout`, safe names), ``files`` (atomic
writes, private directories, streamed JSON lines), ``spec`` (the runner spec,
:class:`~.spec.RunnerSpec`), ``record`` (the runner record,
:class:`~.record.RunnerRecord`), ``network`` (the live network policy file,
:class:`~.network.NetworkPolicyFile`).

Layout under the spool root (``TCO_SPOOL_DIR``), all in :class:`~.layout.SpoolLayout`::

    campaigns/<campaign>/spec.json          runner spec (RunnerSpec), written at launch
    campaigns/<campaign>/inputs.jsonl       one JSON object per line; line N is task N's input
    campaigns/<campaign>/network.json       the network policy in force now (NetworkPolicyFile), when changed
    records/<campaign>/<task>.json          runner record (RunnerRecord), written last, atomically
    records/<campaign>/<task>.stdout        the agent's output, capped by the runner
    records/<campaign>/<task>.stderr
    records/<campaign>/<task>.requests.jsonl  the metering proxy's request records, one per line
    records/<campaign>/<task>.usage         token totals for flexible accounting (OCS/GCS 9)
    records/<campaign>/<task>.outputs/      declared output files, copied and capped
    records/<campaign>/.<task>.json.claim-<token>  a record an ingester has claimed (transient)
    work/<campaign>/<task>/                 the task's work directory (``/sandbox`` inside)
    logs/<campaign>/                        Grid Engine's -o/-e files of the campaign's job
    ingested/<campaign>/<task>.json         records ingest has stored
    quarantine/<campaign>/<task>.json       records ingest refused (malformed, unknown version)
    prices.json                             price table (execution/metering/prices.py's format)
    credentials.json                        {"name": "secret"}, readable by the submit account only

Versions (execution/spool/contract.py): the runner spec is :data:`~.contract.SPEC_VERSION` (1; ``model_endpoints``
was added as an optional key, which readers of version 1 ignore, so the
version did not change; nor when ``network_ceilings`` was). The network policy file is
:data:`~.contract.NETWORK_POLICY_FILE_VERSION` (1). Runner records are :data:`~.contract.RECORD_VERSION` (2);
ingest still reads the versions in :data:`~.contract.RECORD_VERSIONS_READ` (1 lacked
``outputs``, ``sandbox``, ``usage`` and ``requests_path``) and refuses any
other (:class:`~.contract.RecordVersionError`).
"""
