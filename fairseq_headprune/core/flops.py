"""Decoding cost of a fairseq transformer from its shape alone: FLOPs, and the cache reorder as memory traffic.

Pure arithmetic (no fairseq, no model needed), so FLOP-budget pruning can price a head set before building it
(`ModelShape.without`). It follows what fairseq 0.12's SequenceGenerator does with a stock transformer:

- the encoder runs once per sentence, on the source padded to the longest of its batch;
- the encoder output is expanded to one row per beam hypothesis before decoding, and the stock transformer is
  not "beamable" (only BART sets the enc-dec modules' beam size), so encoder-decoder attention projects its
  keys/values for every beam row at the first step (then caches them);
- every decoding step runs one query per beam row through every layer, self-attention over the steps so far;
- from the second step on, fairseq re-indexes (index_select) each decoder self-attention cache (keys and values)
  and the encoder output (encoder_out and encoder_embedding) by the surviving beams. That is a copy, not
  arithmetic: it is counted apart, as `reorder_elements` (tensor elements copied), never folded into the FLOPs.
  (Cached encoder-decoder keys/values are re-indexed only when finished sentences leave the batch: not counted.)

FLOPs are 2 x multiply-adds of the matrix products (projections, attention scores and weighted sums, FFNs,
output layer); softmax, LayerNorm, biases and beam bookkeeping are left out. Their ratio between two models is a
FLOP ratio: what the speed-up would be if time followed these FLOPs, not a bound on the measured one.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Sequence, Tuple

from fairseq_headprune.core.shape import ModelShape


@dataclass(frozen=True)
class DecodeCost:
    """flops: 2 x multiply-adds. reorder_elements: elements copied by the per-step cache/encoder-out reorder."""

    flops: float
    reorder_elements: float


def padded_sources(src_lens: Sequence[int], batch_size: int) -> List[int]:
    """Each sentence's source length as the encoder sees it: padded to the longest of its batch (in order)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1: {batch_size}")
    out = []
    for k in range(0, len(src_lens), batch_size):
        chunk = src_lens[k : k + batch_size]
        out += [max(chunk)] * len(chunk)
    return out


def decode_cost(shape: ModelShape, src_lens: Sequence[int], tgt_lens: Sequence[int], beam: int,
                batch_size: int = 1) -> DecodeCost:
    """Cost of beam-decoding these sentences: src_lens source tokens (with EOS), tgt_lens decoding steps each.

    Sentences are batched in the given order; a sentence stays in the batch for its own steps (fairseq drops
    finished sentences), which makes the hypothesis length (with EOS) a slight underestimate of the steps run."""
    if len(src_lens) != len(tgt_lens):
        raise ValueError(f"{len(src_lens)} source lengths but {len(tgt_lens)} target lengths")
    if beam < 1:
        raise ValueError(f"beam must be at least 1: {beam}")
    d = shape.embed_dim
    macs = reorder = 0.0
    for s, t in zip(padded_sources(src_lens, batch_size), tgt_lens):
        for i, ffn in enumerate(shape.enc_ffn, start=1):
            a = shape.width("enc-self", i)
            macs += 4 * s * d * a + 2 * s * s * a + 2 * s * d * ffn  # q/k/v/out, scores and sums, FFN
        steps_sum = t * (t + 1) // 2  # self-attention attends over 1, 2, ..., t positions
        cached_sum = t * (t - 1) // 2  # the reorder before step j copies a cache of j - 1 positions, j = 2..t
        for i, ffn in enumerate(shape.dec_ffn, start=1):
            sa, ca = shape.width("dec-self", i), shape.width("enc-dec", i)
            macs += beam * 2 * s * d * ca  # encoder keys/values, projected once per beam row
            macs += beam * (t * (4 * d * sa + 2 * d * ca + 2 * s * ca + 2 * d * ffn) + 2 * steps_sum * sa)
            reorder += beam * 2 * cached_sum * sa  # prev_key and prev_value
        macs += beam * t * d * shape.vocab
        reorder += beam * max(t - 1, 0) * 2 * s * d  # encoder_out and encoder_embedding, once per reorder
    return DecodeCost(flops=2 * macs, reorder_elements=reorder)


def decode_flops(model_or_shape, src_lens: Sequence[int], tgt_lens: Sequence[int], beam: int,
                 batch_size: int = 1) -> float:
    """FLOPs of decode_cost, from a ModelShape or a fairseq transformer (read with ModelShape.of)."""
    shape = model_or_shape if isinstance(model_or_shape, ModelShape) else ModelShape.of(model_or_shape)
    return decode_cost(shape, src_lens, tgt_lens, beam, batch_size).flops


def flop_ratio(base, pruned, src_lens: Sequence[int], tgt_lens: Sequence[int], beam: int,
               batch_size: int = 1) -> float:
    """FLOPs of base over FLOPs of pruned on the same sentences and lengths (> 1: pruned does less arithmetic)."""
    return (decode_flops(base, src_lens, tgt_lens, beam, batch_size)
            / decode_flops(pruned, src_lens, tgt_lens, beam, batch_size))


def reorder_ratio(base, pruned, src_lens: Sequence[int], tgt_lens: Sequence[int], beam: int,
                  batch_size: int = 1) -> float:
    """Elements the per-step cache reorder copies, base over pruned: the other side of decoding time, memory
    traffic that shrinks with the decoder self-attention heads and not with the FFNs or the output layer."""
    shapes = [m if isinstance(m, ModelShape) else ModelShape.of(m) for m in (base, pruned)]
    base_cost, pruned_cost = (decode_cost(s, src_lens, tgt_lens, beam, batch_size) for s in shapes)
    return base_cost.reorder_elements / max(pruned_cost.reorder_elements, 1e-30)


def flops_per_head(shape: ModelShape, src_lens: Sequence[int], tgt_lens: Sequence[int], beam: int,
                   batch_size: int = 1) -> Dict[Tuple[str, int], float]:
    """FLOPs one head of each (type, layer) costs on these sentences: removing k of them saves k times that
    (cost is linear in a module's head count)."""
    base = decode_cost(shape, src_lens, tgt_lens, beam, batch_size).flops
    out = {}
    for (attn_type, layer), n in shape.heads.items():
        if n:
            fewer = replace(shape, heads={**shape.heads, (attn_type, layer): n - 1})
            out[(attn_type, layer)] = base - decode_cost(fewer, src_lens, tgt_lens, beam, batch_size).flops
    return out
