"""The Grid Engine adapter, one module per concern.

- :mod:`.adapter`: :class:`~.adapter.GridEngine`, the ``SchedulerAdapter`` of a cell;
- :mod:`.commands`: running qstat/qhost/qconf/qmod/qdel/qalter in the cell's
  environment, with unreachable-qmaster detection and the control argv;
- :mod:`.native_spec`: validation of a submission, the native specification,
  job names and job id arguments;
- :mod:`.drmaa`: the process's DRMAA session (submission);
- :mod:`.parsers`: one parser per output (qstat, qstat -j, qstat -g c, qhost,
  qquota, qconf -se, sge_share_mon, the accounting file).
"""
