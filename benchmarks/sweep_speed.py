#!/usr/bin/env python
"""The sweeps' speed targets, measured side by side in one run on the bundled De-En model (one thread per process).

  demo      masks-per-batch auto vs each fixed 1, 2, 4, 8, 16 on the demo slice (the first 64 sentences of Multi30k
            test2016, greedy, hypotheses capped at 1.2 x source + 10, as recipes/demo.sh decodes them): the same
            --demo-masks single-head masks decoded under each choice, interleaved (every choice decodes 16 more
            masks per round, the order rotating), so that a change of machine load falls on every choice alike;
            auto keeps one MaskBatching for its whole sweep (its ramp is in its time).
                                                                 bar: auto within 10% of the best fixed choice
  beam5     the same on 500 test2016 sentences at beam 5 (--max-tokens 4000), rounds of 4 masks: each fixed k on
            max(k, 4) masks, auto on --beam5-masks masks.
                                                                 bar: auto within 10% of the best fixed choice
  workers   one sweep (`fairseq-headprune ablate --mode single --types T` on the demo slice, auto; T from
            --workers-types: every type by default, the demo's own 144-mask sweep) with --workers 1 and
            --workers 2, wall time of the whole command (start-up, model loads, pool start, table)
                                                                 bar: 2 workers >= 1.7x faster than 1
  scaling   the CPU's own ceiling for that bar: one fixed decode alone, then two copies at once (not in the default)
  encoder   encoder self-attention masks: the encoder from the lowest masked layer vs whole (not in the default)
Hypotheses are checked identical across every choice. The machine's load is printed before and after each
section: timings taken while other processes run are contended; compare only ratios within one run.

usage: benchmarks/sweep_speed.py [--sections demo,beam5,workers] [--demo-masks 144] [--beam5-masks 16]
                                 [--workers-types enc-self,enc-dec,dec-self] [--workers-beam 1]
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
MODEL = os.path.join(ROOT, "checkpoints/de-en")
RAW = os.path.join(ROOT, "data/multi30k-test2016/test")
FIXED = (1, 2, 4, 8, 16)


def load_line() -> str:
    """The machine's load: load averages, CPUs busy over the last second, and the other busy processes."""
    from fairseq_headprune.decoding.workers import free_cores

    free, why = free_cores(1.0)
    one, five, _ = os.getloadavg()
    busy = subprocess.run(["ps", "-eo", "pcpu,args", "--sort=-pcpu"], capture_output=True, text=True).stdout
    top = [line.strip()[:90] for line in busy.splitlines()[1:] if float(line.split()[0]) >= 20.0][:4]
    return f"load {one:.2f} (1 min) {five:.2f} (5 min); {why}; busy: {' | '.join(top) or 'nothing'}"


def encode(n: int, work: str) -> str:
    data = os.path.join(work, f"slice-{n}", "data-bin")
    if not os.path.exists(os.path.join(data, "test.de-en.de.bin")):
        os.makedirs(os.path.dirname(data), exist_ok=True)
        prefix = os.path.join(work, f"slice-{n}", "test")
        for lang in ("de", "en"):
            with open(f"{RAW}.{lang}", encoding="utf-8") as f, open(f"{prefix}.{lang}", "w", encoding="utf-8") as g:
                g.writelines(f.readlines()[:n])
        subprocess.run(["bash", os.path.join(ROOT, "data_prep/encode-for-model.sh"), MODEL, "de", "en", prefix, data,
                        "test"], check=True)
    return data


def generation_args(data: str, beam: int, capped: bool):
    cap = ["--max-len-a", "1.2", "--max-len-b", "10"] if capped else []
    return [data, "--path", os.path.join(MODEL, "model.pt"), "--gen-subset", "test", "--beam", str(beam), *cap,
            "--max-tokens", "4000", "--bpe", "subword_nmt", "--bpe-codes", os.path.join(MODEL, "code"),
            "--tokenizer", "moses", "-s", "de", "-t", "en"]


def evaluator_for(argv):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_headprune.decoding.evaluate import SubsetEvaluator
    from fairseq_headprune.fairseq_io.loading import PACKAGE_DIR, load

    parser = options.get_generation_parser(default_task="translation_headprune")
    args = options.parse_args_and_arch(parser, input_args=["--user-dir", PACKAGE_DIR, *argv])
    return SubsetEvaluator(load(convert_namespace_to_omegaconf(args)), "test")


def spread_masks(evaluator, n: int):
    from fairseq_headprune.core.heads import HeadLayout

    heads = HeadLayout.of(evaluator.loaded.model).all_heads()
    return [[heads[i * len(heads) // n]] for i in range(n)]


def interleaved(evaluator, masks, options, chunk, sizes=None):
    """Decode `masks` under every --masks-per-batch option, round-robin: in each round every option decodes about
    `chunk` more masks (whole groups; the order of options rotates), so that a change of machine load falls on all
    options alike. Each option keeps its own MaskBatching for the whole sweep (auto: its ramp, then its choice), as a
    sweep does. sizes[option]: decode only the first N masks under that option. Returns per option: seconds per
    mask, hypotheses, batching."""
    from fairseq_headprune.decoding.mask_batching import MaskBatching, output_units, rows_per_search

    sizes = sizes or {}
    rows = rows_per_search(evaluator)  # as the sweeps give it to auto
    state = {o: {"batching": MaskBatching(o, rows=rows), "pos": 0, "seconds": 0.0, "hyps": []} for o in options}
    rnd = 0
    while any(s["pos"] < sizes.get(o, len(masks)) for o, s in state.items()):
        shift = rnd % len(options)
        for option in options[shift:] + options[:shift]:
            s, total = state[option], sizes.get(option, len(masks))
            target = min(total, s["pos"] + chunk)
            while s["pos"] < target:
                k = s["batching"].next_size(total - s["pos"])
                group = masks[s["pos"] : s["pos"] + k]
                t = time.perf_counter()
                hyps = evaluator.translate_many(group, k)
                seconds = time.perf_counter() - t
                s["batching"].record(k, seconds, output_units(hyps))
                s["seconds"] += seconds
                s["hyps"] += hyps
                s["pos"] += k
        rnd += 1
    out = {}
    for option, s in state.items():
        s["batching"].finish()
        out[option] = (s["seconds"] / s["pos"], s["hyps"], s["batching"])
    return out


def verdict(per_mask):
    best_k = min(FIXED, key=lambda k: per_mask[k])
    ratio = per_mask["auto"] / per_mask[best_k]
    return (f"auto / best fixed ({best_k}) = {ratio:.3f}   (bar <= 1.10: "
            f"{'met' if ratio <= 1.10 else 'MISSED'})")


def report(results, masks_of):
    reference = max((r[1] for r in results.values()), key=len)
    for option, (per_mask, hyps, batching) in results.items():
        assert hyps == reference[: len(hyps)], f"--masks-per-batch {option} changed a hypothesis"
        extra = f"  auto chose {batching.reason()}" if option == "auto" else ""
        print(f"masks per batch {str(option):>4}  {per_mask:6.3f} s/mask on {masks_of(option)} masks{extra}")
    print(verdict({o: r[0] for o, r in results.items()}))
    print("identical hypotheses for every choice: yes")


def section_demo(work: str, n_masks: int) -> None:
    ev = evaluator_for(generation_args(encode(64, work), 1, capped=True))
    masks = spread_masks(ev, n_masks)
    ev.translate()  # warm-up
    print(f"\n== demo slice: {ev.size} sentences, greedy, {len(ev.samples)} batch(es) of "
          f"{[s['id'].numel() for s in ev.samples]} sentences, {len(masks)} single-head masks per choice, "
          "interleaved in rounds of 16 ==", flush=True)
    print(load_line(), flush=True)
    results = interleaved(ev, masks, [*FIXED, "auto"], 16)
    report(results, lambda option: len(masks))
    print(load_line(), flush=True)


def section_beam5(work: str, n_masks: int) -> None:
    ev = evaluator_for(generation_args(encode(500, work), 5, capped=False))
    masks = spread_masks(ev, n_masks)
    ev.translate()  # warm-up
    sizes = {k: max(k, 4) for k in FIXED}
    print(f"\n== 500 test2016 sentences, beam 5: {len(ev.samples)} batches of "
          f"{[s['id'].numel() for s in ev.samples]} sentences; fixed k on max(k, 4) masks, auto on {len(masks)}, "
          "interleaved in rounds of 4 masks ==", flush=True)
    print(load_line(), flush=True)
    results = interleaved(ev, masks, [*FIXED, "auto"], 4, sizes)
    report(results, lambda option: sizes.get(option, len(masks)))
    print(load_line(), flush=True)


def section_workers(work: str, types: str, beam: int = 1) -> None:
    data = encode(64, work)
    print(f"\n== one sweep on 1 and 2 local workers: fairseq-headprune ablate --mode single --types {types}, demo "
          f"slice, {'greedy' if beam == 1 else f'beam {beam}'}, --masks-per-batch auto (wall time of the whole "
          "command: start-up, model loads and the baseline included) ==", flush=True)
    print(load_line(), flush=True)
    exe = os.path.join(ROOT, ".venv/bin/fairseq-headprune")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    walls, rows = {}, {}
    for n in (1, 2, 2, 1):
        out = os.path.join(work, f"workers-{n}")
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        refs = os.path.join(work, "slice-64", "test.en")
        subprocess.run([exe, "ablate", *generation_args(data, beam, capped=True), "--results-dir", out,
                        "--mode", "single", "--types", types, "--references", refs, "--workers", str(n),
                        "--no-progress-bar"],
                       check=True, env=env, capture_output=True)
        walls.setdefault(n, []).append(time.perf_counter() - start)
        with open(os.path.join(out, "ablation-single.jsonl"), encoding="utf-8") as f:
            body = [line for line in f.read().splitlines()[1:] if '"key": "run:' not in line]
        rows.setdefault(n, []).append(body)
        print(f"  --workers {n}: {walls[n][-1]:6.1f} s, {len(body)} rows", flush=True)
    same = all(r == rows[1][0] for runs in rows.values() for r in runs)
    one, two = (sum(walls[n]) / len(walls[n]) for n in (1, 2))
    print(f"--workers 1  {one:6.1f} s  (runs: {', '.join(f'{t:.1f}' for t in walls[1])})")
    print(f"--workers 2  {two:6.1f} s  (runs: {', '.join(f'{t:.1f}' for t in walls[2])})")
    print(f"1 worker / 2 workers = {one / two:.3f}   (bar >= 1.70: {'met' if one / two >= 1.7 else 'MISSED'})")
    print(f"identical rows in every run: {'yes' if same else 'NO'}")
    print(load_line(), flush=True)


def _decode_masks(work: str, n_masks: int) -> float:
    """Seconds one process takes to decode `n_masks` single-head masks on the demo slice, 8 a search (after a
    warm-up decode): the unit of work of the scaling section."""
    ev = evaluator_for(generation_args(encode(64, work), 1, capped=True))
    masks = spread_masks(ev, n_masks)
    ev.translate()
    start = time.perf_counter()
    ev.translate_many(masks, 8)
    return time.perf_counter() - start


def section_scaling(work: str) -> None:
    """The CPU's own ceiling for two workers: the same decode alone, then in two processes at once."""
    print("\n== the CPU's scaling: 48 masks of the demo slice (8 a search) decoded by one process alone, then by two "
          "processes at once (each its own copy; ratio = 2 x alone / the pair's wall time) ==", flush=True)
    print(load_line(), flush=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--decode-once", "--work", work]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def times(n):
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) for _ in range(n)]
        return [float(p.communicate()[0].strip().splitlines()[-1]) for p in procs]

    alone = times(1) + times(1)
    pair = times(2)
    one = sum(alone) / len(alone)
    print(f"alone: {', '.join(f'{t:.1f}' for t in alone)} s; two at once: {', '.join(f'{t:.1f}' for t in pair)} s")
    print(f"throughput of two processes / one = {2 * one / max(pair):.3f} (the most two workers can gain here, "
          "before any start-up)")
    print(load_line(), flush=True)


def section_encoder(work: str) -> None:
    """Masks of encoder self-attention: the encoder run from its lowest masked layer (the unmasked inputs of that
    layer reused, as the sweeps do) against the whole encoder, alternating, CPU time of this process."""
    from fairseq_headprune.core.heads import Head
    from fairseq_headprune.decoding.layer_inputs import LayerInputCache

    ev = evaluator_for(generation_args(encode(64, work), 1, capped=True))
    masks = [[Head("enc-self", layer, h)] for layer in range(1, 7) for h in range(1, 9)]
    ev.translate()
    print("\n== the demo slice's 48 encoder self-attention masks, 8 a search: encoder from layer 1 vs from the lowest "
          "masked layer (CPU s of one process, two alternations) ==", flush=True)
    print(load_line(), flush=True)
    lowest = LayerInputCache.encoder_out_from

    def whole(self, b, net_input, start, times=1):
        return lowest(self, b, net_input, 0, times)

    runs = {}
    try:
        for _ in range(2):
            for name, fn in (("whole encoder", whole), ("from the lowest masked layer", lowest)):
                LayerInputCache.encoder_out_from = fn
                start = time.process_time()
                hyps = ev.translate_many(masks, 8)
                runs.setdefault(name, []).append((time.process_time() - start, hyps))
    finally:
        LayerInputCache.encoder_out_from = lowest
    (a, ra), (b, rb) = runs.items()
    assert all(r[1] == ra[0][1] for r in ra + rb), "the hypotheses changed"
    for name, r in runs.items():
        print(f"{name}: {', '.join(f'{t:.2f}' for t, _ in r)} CPU s")
    print(f"{a} / {b} = {sum(t for t, _ in ra) / sum(t for t, _ in rb):.3f}; identical hypotheses: yes")
    print(load_line(), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--decode-once", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sections", default="demo,beam5,workers")
    p.add_argument("--demo-masks", type=int, default=144)  # the demo's own single-head sweep: every head
    p.add_argument("--beam5-masks", type=int, default=16)
    p.add_argument("--workers-types", default="enc-self,enc-dec,dec-self", help="the workers section's sweep")
    p.add_argument("--workers-beam", type=int, default=1, help="the workers section's beam (1: the demo's)")
    p.add_argument("--work", default=os.path.join(ROOT, "work/bench-sweep"))
    a = p.parse_args()
    os.environ["PATH"] = os.path.join(ROOT, ".venv/bin") + os.pathsep + os.environ["PATH"]
    from fairseq_headprune import cli
    from fairseq_headprune.fairseq_io.loading import trust_fairseq_checkpoints

    trust_fairseq_checkpoints()
    cli._quiet_dependencies()
    import torch

    torch.set_num_threads(1)
    if a.decode_once:  # the scaling section's child
        print(f"{_decode_masks(a.work, 48):.3f}")
        return
    print(f"benchmarks/sweep_speed.py {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, host {os.uname().nodename}, "
          f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, sections {a.sections}")
    sections = a.sections.split(",")
    if "demo" in sections:
        section_demo(a.work, a.demo_masks)
    if "beam5" in sections:
        section_beam5(a.work, a.beam5_masks)
    if "workers" in sections:
        section_workers(a.work, a.workers_types, a.workers_beam)
    if "scaling" in sections:
        section_scaling(a.work)
    if "encoder" in sections:
        section_encoder(a.work)


if __name__ == "__main__":
    main()
