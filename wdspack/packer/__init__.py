"""PRODUCE: raw multimodal data in, packed shards out (``wdspack pack``, ``wdspack reshard``).

In data-flow order:

* :mod:`.sources` — the files people have → records (chats, captions, documents), as units of work
* :mod:`.samples` — a chat record tokenized with the model's chat template, images expanded, the
  loss mask on assistant turns; :mod:`.text` — captions and documents, without a chat
  (:mod:`.tokenized`: the sample both return)
* :mod:`.planner` — the knapsack planners: integers in, groups of indices out (no I/O)
* :mod:`.job` — the pack job: measure → plan → write, resumable (:mod:`.config`, :mod:`.spool`,
  :mod:`.selection`), its tasks run by :mod:`.executors` (a process pool or Ray)
* :mod:`.reshard` — packed shards → samples → plan → write, without the raw data

It writes through :mod:`wdspack.format` and :mod:`wdspack.storage`, and never imports the loader.
"""
