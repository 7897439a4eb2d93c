"""fairseq models registered by name: the Transformer with head masks, gates and uneven heads per layer."""
