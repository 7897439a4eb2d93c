"""Head importance per sentence (our `score`) vs per target token (the reference code's) on the bundled De-En
model, Multi30k valid: both rankings over the 144 heads and their Spearman correlation (scipy).

Run from the repository root:
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/importance_per_position.py
(--max-tokens 4000; weights frozen, eval mode, fp32; about 20 minutes of one core, 55 s of it per sentence.)
"""
import json
import os
import sys
import time

import torch
from scipy.stats import kendalltau, spearmanr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "results", "de-en", "importance-per-position")
ARGV = ["work/de-en/data-bin", "--path", "checkpoints/de-en/model.pt", "--gen-subset", "valid",
        "--max-tokens", "4000", "--task", "translation_headprune", "--user-dir", "fairseq_headprune"]


def main():
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_headprune.criterions.head_importance import HeadImportanceCriterion
    from fairseq_headprune.core.importance import normalize_by_layer, to_nested_lists
    from fairseq_headprune.fairseq_io.loading import batches, load
    from fairseq_headprune.records.identity import file_sha256
    from fairseq_headprune.studies.scoring import compute_importance, frozen_weights

    torch.manual_seed(1)
    parser = options.get_generation_parser(default_task="translation_headprune")
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, input_args=ARGV))
    loaded = load(cfg)
    started = time.time()
    per_sentence, stats = compute_importance(loaded, "valid")  # exactly what `fairseq-headprune score` computes
    t_sentence = time.time() - started

    model = loaded.model
    model.eval()
    criterion = HeadImportanceCriterion(loaded.task, sentence_avg=False, per_position=True)
    _, samples = batches(loaded, "valid")
    started = time.time()
    with frozen_weights(model):
        for i, sample in enumerate(samples, 1):
            criterion(model, sample)  # forward + one backward per target position, accumulated inside
            print(f"batch {i}/{len(samples)}: {sample['target'].size(0)} sentences, "
                  f"{sample['target'].size(1)} positions, {time.time() - started:.0f}s", file=sys.stderr)
    t_position = time.time() - started
    per_position = criterion.accumulator.mean()
    assert criterion.accumulator.sentences == stats["sentences"]

    keys = sorted(per_sentence, key=lambda k: (("enc-self", "enc-dec", "dec-self").index(k[0]), k[1]))
    result = {"definition": {
        "per_sentence": "I_h = mean over sentences x of |dL(x)/dxi_h|, L(x) the summed token NLL of x "
                        "(fairseq_headprune.studies.scoring.compute_importance, as `score`)",
        "per_position": "I_h = sum over target tokens t (EOS included) of |dl_t/dxi_h| / number of target tokens "
                        "(HeadImportanceCriterion(per_position=True): one backward per target position)",
        "ranking": "heads ordered by I_h; Spearman and Kendall over the 144 heads (scipy.stats), on the raw scores "
                   "and on the per-layer l2-normalised scores that `score` writes and pruning orders use",
        "bottom_overlap": "heads among the k least important by both definitions, k = 10%..50% of 144",
    },
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/importance_per_position.py",
        "checkpoint": "checkpoints/de-en/model.pt",
        "checkpoint_sha256": file_sha256("checkpoints/de-en/model.pt"),
        "data": "work/de-en/data-bin", "subset": "valid",
        "max_tokens": 4000, "sentences": stats["sentences"], "target_tokens": criterion.accumulator.tokens,
        "nll_per_token": stats["nll_per_token"], "seconds": {"per_sentence": t_sentence, "per_position": t_position},
        "heads": sum(per_sentence[k].numel() for k in keys)}
    for name, transform in (("raw", lambda s: s), ("normalized_by_layer", normalize_by_layer)):
        a, b = transform(per_sentence), transform(per_position)
        x = torch.cat([a[k] for k in keys]).tolist()
        y = torch.cat([b[k] for k in keys]).tolist()
        rho, p = spearmanr(x, y)
        tau, p_tau = kendalltau(x, y)
        ranks = {}
        for label, v in (("per_sentence", x), ("per_position", y)):
            ranks[label] = sorted(range(len(v)), key=lambda i: v[i])
        overlap = {}
        for pct in (10, 20, 30, 40, 50):
            k = round(len(x) * pct / 100)
            overlap[f"{pct}%"] = len(set(ranks["per_sentence"][:k]) & set(ranks["per_position"][:k])) / k
        result[name] = {"spearman": rho, "spearman_p": p, "kendall_tau": tau, "kendall_p": p_tau,
                        "bottom_overlap": overlap}
        result.setdefault("scores", {})[name] = {"per_sentence": to_nested_lists(a),
                                                 "per_position": to_nested_lists(b)}
    with open(os.path.join(OUT, "importance-per-position.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("raw", "normalized_by_layer", "seconds")}, indent=1))


if __name__ == "__main__":
    main()
