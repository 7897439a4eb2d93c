"""Decoding and scoring as fairseq-generate does them, with head masks batched and work spread over processes."""
