"""`fairseq-headprune speed`: does removing heads make generation faster? (Michel et al. Table 4)

Generation throughput of the unpruned model, the masked model (heads zeroed, same work) and the physically
pruned model, at several batch sizes, over several interleaved runs (mean and standard deviation). Beside the
measurement: the FLOP bound (the speed-up if time followed the decoding FLOPs of these sentences exactly) and
the incremental state the decoder keeps (keys and values cached per step, which shrink with the heads).
"""
from __future__ import annotations

import copy
import os
import statistics
import time
from typing import Dict, List

import torch

from fairseq_headprune.errors import UserError
from fairseq_headprune.heads import HeadLayout, attention_modules, parse_head_spec
from fairseq_headprune.loading import load
from fairseq_headprune.masking import set_head_masks
from fairseq_headprune.results.log import write_json_atomic
from fairseq_headprune.surgery import prune_model


def add_args(parser) -> None:
    g = parser.add_argument_group("speed")
    g.add_argument("--results-dir", required=True)
    g.add_argument("--heads", required=True, help="heads to prune: TYPE:LAYER:HEADS,... or @file.json")
    g.add_argument("--batch-sizes", default="1,4,16,64")
    g.add_argument("--runs", type=int, default=3)
    g.add_argument("--num-sentences", type=int, default=128, help="sentences decoded per run and batch size")


def decode_flops(model, src_lens: List[int], hyp_lens: List[int], beam: int) -> float:
    """Multiply-adds x2 of beam decoding these sentences: projections, attention scores and sums, FFNs, output.

    Attention costs follow each module's own head count, so the same function prices pruned models."""
    mods = attention_modules(model)
    d = model.encoder.embed_tokens.embedding_dim
    vocab = model.decoder.output_projection.out_features
    enc_ffn = [layer.fc1.out_features for layer in model.encoder.layers]
    dec_ffn = [layer.fc1.out_features for layer in model.decoder.layers]
    width = {key: attn.num_heads * attn.head_dim for key, attn in mods.items()}
    total = 0.0
    for s, t in zip(src_lens, hyp_lens):
        for i, ffn in enumerate(enc_ffn, start=1):
            a = width[("enc-self", i)]
            total += 2 * (4 * s * d * a + 2 * s * s * a + 2 * s * d * ffn)
        for i, ffn in enumerate(dec_ffn, start=1):
            self_a, cross_a = width[("dec-self", i)], width[("enc-dec", i)]
            total += 2 * 2 * s * d * cross_a  # encoder keys/values, once per sentence
            for step in range(1, t + 1):
                per_row = 4 * d * self_a + 2 * step * self_a + 2 * d * cross_a + 2 * s * cross_a + 2 * d * ffn
                total += 2 * beam * per_row
        total += 2 * beam * t * d * vocab
    return total


class IncrementalStateMeter:
    """The largest incremental state (bytes) of the decoder during generation, read at its last layer (fairseq
    calls decoder.forward directly, past module hooks, but its layers through __call__)."""

    def __init__(self, decoder):
        self.peak = 0
        self.handle = decoder.layers[-1].register_forward_pre_hook(self._measure, with_kwargs=True)

    def _measure(self, _module, args, kwargs):
        # TransformerDecoderLayer.forward(x, encoder_out, encoder_padding_mask, incremental_state, ...)
        state = kwargs.get("incremental_state", args[3] if len(args) > 3 else None)
        if state:
            size = sum(v.numel() * v.element_size() for buf in state.values() for v in buf.values()
                       if torch.is_tensor(v))
            self.peak = max(self.peak, size)

    def close(self):
        self.handle.remove()


def fixed_batches(loaded, subset: str, n: int, batch_size: int):
    """The first n sentences of the subset in batches of exactly batch_size (the last may be smaller)."""
    dataset = loaded.task.dataset(subset)
    ids = list(range(min(n, len(dataset))))
    return [dataset.collater([dataset[i] for i in ids[k : k + batch_size]]) for k in range(0, len(ids), batch_size)]


@torch.no_grad()
def timed_generation(task, generator, model, batches) -> Dict[str, float]:
    start = time.perf_counter()
    sentences = tokens = 0
    for sample in batches:
        for nbest in task.inference_step(generator, [model], sample):
            sentences += 1
            tokens += len(nbest[0]["tokens"])
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sentences": sentences, "tokens": tokens}


def run(cfg, args) -> None:
    loaded = load(cfg)
    heads = parse_head_spec(args.heads)
    layout = HeadLayout.of(loaded.model)
    layout.check(heads)
    try:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        raise UserError(f"--batch-sizes must be numbers, e.g. 1,4,16,64: {args.batch_sizes!r}") from None
    subset, task = cfg.dataset.gen_subset, loaded.task
    task.load_dataset(subset, task_cfg=loaded.saved_cfg.task)
    masked = copy.deepcopy(loaded.model)
    set_head_masks(masked, heads)
    pruned = prune_model(copy.deepcopy(loaded.model), heads)
    models = {"unpruned": loaded.model, "masked": masked, "pruned": pruned}
    generators = {name: task.build_generator([m], cfg.generation) for name, m in models.items()}
    result = {"heads_pruned": len(heads), "heads_total": len(layout.all_heads()), "subset": subset,
              "beam": cfg.generation.beam, "threads": torch.get_num_threads(), "batch_sizes": {}}
    for bs in batch_sizes:
        data = fixed_batches(loaded, subset, args.num_sentences, bs)
        times: Dict[str, List[Dict]] = {name: [] for name in models}
        meters = {}
        for name, model in models.items():  # warm-up: kernels meet the shapes once, state sizes measured
            meters[name] = IncrementalStateMeter(model.decoder)
            timed_generation(task, generators[name], model, data[:1])
            meters[name].close()
        for _ in range(args.runs):
            for name, model in models.items():  # interleaved, so drift in machine load hits all alike
                times[name].append(timed_generation(task, generators[name], model, data))
        row = {}
        for name, runs in times.items():
            rates = [r["sentences"] / r["seconds"] for r in runs]
            row[name] = {"sentences_per_s": statistics.mean(rates), "sentences_per_s_std": statistics.pstdev(rates),
                         "tokens_per_s": statistics.mean(r["tokens"] / r["seconds"] for r in runs),
                         "incremental_state_bytes": meters[name].peak}
        for name in ("masked", "pruned"):
            # tokens/s: a pruned model may write longer or shorter hypotheses than the unpruned one
            row[name]["speedup"] = row[name]["tokens_per_s"] / row["unpruned"]["tokens_per_s"]
            row[name]["speedup_sentences"] = row[name]["sentences_per_s"] / row["unpruned"]["sentences_per_s"]
        row["pruned"]["speedup_over_masked"] = row["pruned"]["tokens_per_s"] / row["masked"]["tokens_per_s"]
        result["batch_sizes"][str(bs)] = row
        print(f"batch {bs:>3}: " + ", ".join(f"{n} {r['sentences_per_s']:.1f}±{r['sentences_per_s_std']:.1f} sent/s "
                                          f"{r['tokens_per_s']:.0f} tok/s" for n, r in row.items())
              + f"; pruned speed-up {row['pruned']['speedup']:.3f} (tokens/s)")
    sample_batches = fixed_batches(loaded, subset, args.num_sentences, 64)
    src_lens, hyp_lens = _lengths(task, generators["unpruned"], loaded.model, sample_batches)
    beam = cfg.generation.beam
    # FLOPs per token on the same sentences: what time would give if it followed the arithmetic exactly
    bound = decode_flops(loaded.model, src_lens, hyp_lens, beam) / decode_flops(pruned, src_lens, hyp_lens, beam)
    result["flop_bound_speedup"] = bound
    for row in result["batch_sizes"].values():
        row["pruned"]["speedup_over_flop_bound"] = row["pruned"]["speedup"] / bound
    result["params"] = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    out = os.path.join(args.results_dir, "speed.json")
    write_json_atomic(out, result)
    print(f"FLOP bound of the speed-up: {bound:.3f}\nwrote {out}")


@torch.no_grad()
def _lengths(task, generator, model, batches):
    src, hyp = [], []
    for sample in batches:
        lens = sample["net_input"]["src_lengths"].tolist()
        for s, nbest in zip(lens, task.inference_step(generator, [model], sample)):
            src.append(s)
            hyp.append(len(nbest[0]["tokens"]))
    return src, hyp
