"""Heads addressed, masked, gated and scored; a model's shape as data (shape); heads, FFN units, layers and target
words removed (surgery): pure functions and small modules on tensors and fairseq modules (no files, no argparse)."""
