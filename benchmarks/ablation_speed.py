#!/usr/bin/env python
"""The ablation sweep's speed bar, measured side by side in one run on the bundled De-En model.

  sweep ratio     time of an in-process BLEU sweep over N single-head masks / (N x one unmasked decode)   <= 1.0
  vs per-process  per-mask time of one `fairseq-generate --mask-heads` process per mask (the papers' way) /
                  per-mask time of the sweep                                                               >= 1.5
                  ... and its ceiling for an exact decode per mask: only the encoder pass can be skipped, and
                  only for masks that leave the encoder alone
                  ... with identical detokenised hypotheses for every mask compared
  loss preview    BLEU sweep time / loss-preview time over the same masks                                  >= 20
                  ... per attention type, and the ratio's best case: a mask whose forward is only the output
                  layer and log-softmax over every reference token, the part of an exact NLL no mask can skip
                  (the preview starts each forward at the lowest masked layer from cached unmasked layer
                  inputs: an encoder mask still recomputes the whole decoder)

usage: benchmarks/ablation_speed.py [--masks 24] [--process-masks 4] [--sentences 500] [--work work/bench-ablation]
"""
import argparse
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=os.path.join(ROOT, "checkpoints/de-en"))
    p.add_argument("--raw", default=os.path.join(ROOT, "data/multi30k-test2016/test"), help="raw prefix (.de/.en)")
    p.add_argument("--sentences", type=int, default=500)
    p.add_argument("--masks", type=int, default=24)
    p.add_argument("--process-masks", type=int, default=4)
    p.add_argument("--masks-per-batch", type=int, default=1)
    p.add_argument("--work", default=os.path.join(ROOT, "work/bench-ablation"))
    a = p.parse_args()
    bin_dir = os.path.join(ROOT, ".venv/bin")
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ["PATH"]
    data = os.path.join(a.work, "data-bin")
    if not os.path.exists(os.path.join(data, "test.de-en.de.bin")):
        os.makedirs(a.work, exist_ok=True)
        for lang in ("de", "en"):
            with open(f"{a.raw}.{lang}", encoding="utf-8") as f, open(f"{a.work}/slice.{lang}", "w") as g:
                g.writelines(f.readlines()[: a.sentences])
        subprocess.run(["bash", os.path.join(ROOT, "data_prep/encode-for-model.sh"), a.model, "de", "en",
                        f"{a.work}/slice", data, "test"], check=True)
    ckpt = os.path.join(a.model, "model.pt")
    gen = ["--gen-subset", "test", "--beam", "5", "--max-tokens", "4000", "--required-batch-size-multiple", "1",
           "--tokenizer", "moses", "-s", "de", "-t", "en", "--bpe", "subword_nmt",
           "--bpe-codes", os.path.join(a.model, "code")]

    from fairseq_headprune import cli
    from fairseq_headprune.decoding.evaluate import SubsetEvaluator
    from fairseq_headprune.cli import ablate as ablation
    from fairseq_headprune.core.heads import HeadLayout
    from fairseq_headprune.fairseq_io.loading import load
    from fairseq_headprune.core.masking import set_head_masks
    from fairseq_headprune.stats import BleuBootstrap

    cli._quiet_dependencies()
    cfg, _ = cli.parse("ablate", ablation, [data, "--path", ckpt, "--results-dir", a.work, *gen])
    loaded = load(cfg)
    ev = SubsetEvaluator(loaded, "test")
    heads = HeadLayout.of(loaded.model).all_heads()
    masks = [[heads[i * len(heads) // a.masks]] for i in range(a.masks)]

    stock = loaded.task.build_generator([loaded.model], cfg.generation)

    def unmasked_decode():
        """What one decode of the set costs on its own: fairseq's generator, the encoder run every time."""
        with torch.no_grad():
            for sample in ev.samples:
                for nbest in loaded.task.inference_step(stock, [loaded.model], sample):
                    ev.hypothesis_text(nbest[0])

    ev.translate()  # warm-up: kernels meet the batch shapes once
    # The sweep runs in chunks with an unmasked decode before each chunk and after the last, so that the
    # reference time is measured under the same machine load as the sweep around it.
    decodes, sweep, outs = [], 0.0, []
    chunk = max(a.masks_per_batch, 8)
    for start in range(0, len(masks) + 1, chunk):
        t = time.perf_counter()
        unmasked_decode()
        decodes.append(time.perf_counter() - t)
        if start == 0:
            boot = BleuBootstrap(ev.references, ev.translate())
        part = masks[start : start + chunk]
        if not part:
            break
        t = time.perf_counter()
        hyps_of_part = ev.translate_many(part, a.masks_per_batch)
        for hyps in hyps_of_part:
            ev.bleu(hyps), boot.test(hyps)
        sweep += time.perf_counter() - t
        outs += hyps_of_part
    one_decode = sum(decodes) / len(decodes)
    t = time.perf_counter()
    with torch.no_grad():
        for sample in ev.samples:
            loaded.model.encoder.forward_torchscript(sample["net_input"])
    encoder = time.perf_counter() - t  # all a decoder-side mask can skip of an exact decode
    reusing = sum(all(h.type != "enc-self" for h in m) for m in masks) / len(masks)

    ev.nll()  # records the unmasked layer inputs, as the sweep's baseline row does
    t = time.perf_counter()
    ev.nll()
    floor = time.perf_counter() - t  # no mask: the output layer over the cached final features, nothing more
    loss_by_type = {}
    for m in masks:
        t = time.perf_counter()
        set_head_masks(loaded.model, m)
        ev.nll()
        loss_by_type.setdefault(m[0].type, []).append(time.perf_counter() - t)
    set_head_masks(loaded.model, [])
    loss = sum(sum(times) for times in loss_by_type.values())

    per_process, identical = 0.0, 0
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    for m, ours in zip(masks[: a.process_masks], outs):
        t = time.perf_counter()
        proc = subprocess.run(["fairseq-generate", data, "--path", ckpt, *gen, "--user-dir",
                               os.path.join(ROOT, "fairseq_headprune"), "--task", "translation_headprune",
                               "--mask-heads", str(m[0])], capture_output=True, text=True, env=env, check=True)
        lines = sorted((int(ln.split("\t")[0][2:]), ln.split("\t")[2]) for ln in proc.stdout.splitlines()
                       if ln.startswith("D-"))
        hyps = [h for _, h in lines]
        subprocess.run(["sacrebleu", f"{a.work}/data-bin/test.raw.en", "-b"], input="\n".join(hyps) + "\n",
                       capture_output=True, text=True, check=True)
        per_process += time.perf_counter() - t
        identical += hyps == ours
    per_process /= max(1, a.process_masks)
    per_mask_sweep = sweep / len(masks)
    print(f"model {ckpt}: {len(ev.references)} sentences, {len(heads)} heads, {len(masks)} masks, "
          f"threads {torch.get_num_threads()}")
    print(f"one unmasked decode            {one_decode:8.2f} s  (mean of {len(decodes)}: "
          f"{min(decodes):.2f}..{max(decodes):.2f})")
    print(f"BLEU sweep, per mask           {per_mask_sweep:8.2f} s  (masks per batch {a.masks_per_batch})")
    print(f"per-process loop, per mask     {per_process:8.2f} s  ({a.process_masks} masks)")
    print(f"loss preview, per mask         {loss / len(masks):8.2f} s")
    print(f"sweep / (masks x one decode)   {sweep / (len(masks) * one_decode):8.3f}   (bar <= 1.0)")
    print(f"per-process / sweep            {per_process / per_mask_sweep:8.3f}   (bar >= 1.5)")
    best = one_decode - reusing * encoder
    print(f"  ceiling: per-process / (one decode - encoder pass {encoder:.2f} s x {reusing:.0%} of masks) "
          f"{per_process / best:8.3f}")
    print(f"identical hypotheses           {identical}/{min(a.process_masks, len(masks))}")
    print(f"BLEU sweep / loss preview      {sweep / loss:8.3f}   (bar >= 20)")
    by_type = ", ".join(f"{k} {sum(v) / len(v):.2f} s" for k, v in loss_by_type.items())
    print(f"  loss preview per mask by type  {by_type}")
    print(f"  best case: sweep / output layer {per_mask_sweep / floor:6.3f}   (output layer + log-softmax alone "
          f"{floor:.2f} s)")


if __name__ == "__main__":
    main()
