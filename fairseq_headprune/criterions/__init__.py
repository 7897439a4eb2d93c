"""fairseq criteria registered by name: head importance (Michel), L0 gates (Voita), distillation towards the
unpruned model (recover)."""
