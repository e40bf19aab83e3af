"""Training with packed batches: the loss over packed sub-samples (:mod:`.loss`) and the trainer
integrations (:mod:`.trainers`: Hugging Face ``Trainer`` and Accelerate)."""
