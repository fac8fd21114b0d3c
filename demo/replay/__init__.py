"""The seed replay (issue 15): the source article's runs through tco, its table beside ours.

The article (shared/seeds/001, "A real run: 410 agents, 96 slots") reports
three runs on a GCS cluster; :func:`~.main.replay` runs them through tco's own launch
service (:func:`dashboards.launch.service.launch`, the launch form's path), the submit
worker (or, with ``submit_here``, :func:`dashboards.launch.submit.campaign_submit`
in this process), the runner and its sandboxes on the configured cluster:

1. **Two teams, one cluster**: research and engineering launch ``agents``
   demo agents together (half each); their work is drawn from a log-normal
   distribution with the article's median agent work (21.9 s x
   ``work_scale``); agent.q's RQS and the model-seat consumable let 96 run at
   a time and the share tree decides who goes next. One urgent agent
   (``urgent_launch``) is launched once the first wave runs and the rest queue.
2. **A classic job with agents on its outcome**: the demo sweep
   (:func:`demo.sweep.sweep_submit`) on classic.q and one review agent per run
   chained with ``-hold_jid_ad`` (:func:`demo.sweep.sweep_review_launch`),
   talking to the scripted stand-in model through the metering proxy.
3. **The bill**: wall clock per team from :func:`dashboards.billing.bills.bill`
   beside ``qacct -P`` for the same period; tokens and dollars from metering.

Every figure comes from timestamps of the run: the runner records' stages
(``Task.task_started_at`` .. ``teardown_done_at``), the scheduler's submission
time (qstat), the campaign's ``launched_at``/``submitted_at`` (the launch
service and the DRMAA call) and the accounting records. The wall-clock
instant read just before each launch call is the one figure taken here.
While it waits, the replay runs its own ingest loop (qstat poll, runner
records, accounting), which is safe beside the workers' (issue 15 item 6).

With ``live`` (the default), run 1 is also watched from qstat and from
WebSocket clients of the live pages, an admin's and ``watchers`` users' of
both teams (:mod:`demo.watch`; issue 15 items 4 and 5): the lag from a change
in qstat to the browser, every client's changes against what it may see, and
the memory and page times of the web server and workers, printed as their own
section after run 1. Meanwhile the loop leaves the qstat poll to the workers.

The modules: ``options`` (what to replay, the article's figures),
``waiting`` (the replay's ingest loop and its waits), ``figures`` (the
figures computed from the records), ``runs`` (the three runs), ``report``
(the report and its figure) and ``main`` (:func:`~.main.replay`, all of it).
"""
