"""Where a step's rows come from: in-process rollouts with the lag queue (``rollouts``), an inference server
ahead of the trainer and its weight sync (``sampler``, ``server_sampler``, ``sync``), trace files and their
formats (``traces``, ``trace_formats``, ``trace_run``), pushed rows (``pushed``) and the recorder's feed
(``recorder``)."""
