"""Training with packed batches: the loss over packed sub-samples (:mod:`.loss`) and the trainer
integrations (:mod:`.trainers`: Hugging Face ``Trainer`` and Accelerate); context parallelism for long packs
(:mod:`.cp`: the split, :mod:`.cp_attention`: the attention across ranks and the step)."""
