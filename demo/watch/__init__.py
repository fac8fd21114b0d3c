"""Live lag and load during the seed replay (issue 15 items 4 and 5).

While run 1 of the replay goes (:mod:`demo.replay`), this package watches it
from both ends and compares:

- **the scheduler**: :class:`~.samplers.QstatSampler`, a thread that runs ``qstat -xml
  -u '*'`` (the adapter's :meth:`list_tasks`) every ``period_s`` seconds and
  keeps, per task ``(job number, task number)``, the instant of the first
  sample that showed it started (any state past ``pending``/``held``/``error``)
  and the first that no longer listed it (it ended). The instant is when the
  qstat call *began*: a change qstat reports happened before it returned, so
  the lag is never understated by qstat's own run time.
- **the browser**: WebSocket clients (aiohttp, in a thread with its own event
  loop) of tco's live pages, logged in as real users through a session
  cookie: one socket on the queue page (``/ws/queue/``) and one per page of
  each campaign it may see (``/ws/campaigns/<id>/``, 100 tasks a page), each
  message timestamped on arrival. A campaign page's task rows give, per task,
  the arrival of the first snapshot showing it started and the first showing
  it ended (``finishing`` or a terminal state); the queue page's campaign rows
  give counts (started, ended) per campaign.
- **the lag** of a change: its arrival minus its first qstat sighting
  (:func:`~.lags.task_lags`; for the queue page's counts, the k-th sighting against
  the first snapshot counting k, :func:`~.lags.count_lags`).
- **scoping** (:func:`~.lags.scope_check`): what each client may see is computed here
  from the database's memberships (not the selectors the pages use): the
  campaigns of its teams. Every change of those that qstat saw must have
  arrived; no task, campaign or project of another team may have arrived; a
  socket on another team's campaign must be refused (4403).
- **load**: resident memory (``VmRSS`` of ``/proc/<pid>/status``, children
  included) of the web server and worker processes, sampled every second, and
  the time of a few GETs of the queue page and a campaign page during the run.

Clients are :func:`~.users.watcher_users` (``replay-watch-<project>-NN``, viewers and
launchers of one team each, created as needed) plus the admin, whose socket
gives the item-4 lag (it sees every task).

The modules: ``lags`` (the arithmetic: sightings, lags, their breakdown,
scoping), ``samplers`` (qstat, memory and page times), ``browsers`` (the
WebSocket clients), ``users`` (watcher accounts and their sessions),
``live`` (:class:`~.live.LiveWatch`, the whole watch) and ``report`` (the
figures and the report's section).
"""
