"""Operations on a packed dataset, each behind a ``wdspack`` command:

* :mod:`.inspect` — what a dataset holds, in numbers and a picture (``wdspack inspect``);
  :mod:`.mixture` — the same for a mixture: each source's share of an epoch and the mix of its first steps
* :mod:`.verify` — prove a dataset is intact and conserves its sources (``wdspack verify``)
* :mod:`.upload` — publish a dataset to the Hugging Face Hub (``wdspack upload``)
* :mod:`.index` — add the pack index to a dataset packed without one (``wdspack index``)
"""
