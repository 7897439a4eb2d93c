"""Checkpoints, tasks, data and options exactly as fairseq loads them, and fairseq's errors said in one line."""
