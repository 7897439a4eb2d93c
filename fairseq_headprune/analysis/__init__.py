"""Voita et al.'s head analysis: attention capture, layer-wise relevance propagation, each head's function."""
