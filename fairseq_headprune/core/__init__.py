"""Heads addressed, masked, gated, scored and removed: pure functions and small modules on tensors and fairseq
modules (no files, no argparse)."""
