"""Post-mortem: an evidence source for ``ddpdoctor analyze``, read from what PyTorch and torchrun
left behind when a job hung or failed, instead of from a live run's probes.

- :mod:`discover`: which of the files given are flight recorder dumps, error files or logs;
- :mod:`flight_recorder`: PyTorch's flight recorder dumps read as they are (pickle or JSON);
- :mod:`torchrun_files`: torchrun's error files, its failure table, the ranks' logs;
- :mod:`dump_events`: one dump -> the events a live rank writes; :mod:`read_dumps` and
  :mod:`packing`: many dumps converted in a pool of processes;
- :mod:`to_evidence`: ``load(paths) -> PostMortem``, the :class:`~ddpdoctor.analysis.evidence.Evidence`
  (events, observations, the stop snapshot) that the checks judge as they judge a live run's.

Its side: it reads files (the analysis side stays pure) and starts no processes (the caller,
``ddpdoctor.supervisor.analyze``, lends it a pool). It imports only from itself, ``ddpdoctor.schema``
and the analysis side's evidence types (``ddpdoctor.analysis``); neither the analysis side nor the
rank side imports it. No torch.
"""
