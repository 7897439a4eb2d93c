"""Voita et al. (2019), Table 2's last column as one table: each from-scratch configuration beside the L0 run it
was taken from (recipes/voita_from_scratch.sh) and the unpruned base model, all on test2016.

The L0 run is found by its heads, not its name: the configuration's kept-heads.json must equal the heads a row of
compare.jsonl kept, so a table can never pair a from-scratch run with another λ's pruned model.

usage: python recipes/voita_from_scratch_table.py [RESULTS_DIR [VALID_LOSS]]   (defaults results/voita and the base
       run's results/de-en/convergence/valid-loss.txt; writes RESULTS_DIR/from-scratch/table.md and prints it)
"""
import json
import re
import sys
from pathlib import Path

TYPES = ("enc-self", "enc-dec", "dec-self")


def kept_sets_from_masked(masked: str, layers: int, heads: int) -> dict:
    """{type: {layer: kept heads}} from compare's `masked` string (TYPE:LAYER:H+H+..., comma separated)."""
    kept = {t: {i: set(range(1, heads + 1)) for i in range(1, layers + 1)} for t in TYPES}
    for part in filter(None, masked.split(",")):
        t, layer, hs = part.split(":")
        kept[t][int(layer)] -= {int(h) for h in hs.split("+")}
    return kept


def kept_sets_from_json(path: Path, layers: int, heads: int) -> dict:
    """voita_from_scratch.sh's kept-heads.json lists only the layers that lost heads."""
    listed = json.loads(path.read_text())
    kept = {t: {i: set(range(1, heads + 1)) for i in range(1, layers + 1)} for t in TYPES}
    for t, by_layer in listed.items():
        for layer, hs in by_layer.items():
            kept[t][int(layer)] = set(hs)
    return kept


def training_summary(log: Path) -> tuple:
    """(epochs run, best valid loss) from the run's train-progress.log."""
    losses = [float(m.group(1)) for m in re.finditer(r"valid on 'valid' subset \| loss ([0-9.]+)", log.read_text())]
    return len(losses), min(losses) if losses else None


def base_training(convergence: Path) -> tuple:
    """(epochs, best valid loss) of the base run, from lines of epoch, loss, nll, updates."""
    losses = [float(line.split()[1]) for line in convergence.read_text().splitlines() if line.strip()]
    return len(losses), min(losses)


def main(results: Path, convergence: Path) -> int:
    rows = [json.loads(line) for line in (results / "compare.jsonl").read_text().splitlines() if line.startswith("{")]
    header = next(r["header"] for r in rows if "header" in r)
    total = header["total_heads"]
    # the shape, from the heads compare masked (the strongest λ reaches every layer and head number)
    masked = [p.split(":") for r in rows for p in r.get("masked", "").split(",") if p]
    layers = max(int(layer) for _, layer, _ in masked)
    heads = max(int(h) for _, _, hs in masked for h in hs.split("+"))
    if 3 * layers * heads != total:
        print(f"voita_from_scratch_table: error: the masked heads show {layers} layers x {heads} heads, "
              f"not {total} heads", file=sys.stderr)
        return 2
    base = next(r for r in rows if r.get("method") == "unpruned")
    l0 = [r for r in rows if r.get("method") == "l0"]
    control = next((r for r in l0 if not r.get("l0_lambda")), None)
    base_epochs, base_loss = base_training(convergence)
    lines = [
        "| configuration | heads kept (enc-self / enc-dec / dec-self) | L0 λ | pruned model (L0, 300 updates) | "
        "vs λ = 0 control | trained from scratch | vs unpruned | epochs (best valid loss) |",
        "|---|---|---|---|---|---|---|---|",
        f"| unpruned (the base run) | {total} ({' / '.join([str(total // 3)] * 3)}) | | {base['bleu']:.2f} | | "
        f"{base['bleu']:.2f} | | {base_epochs} ({base_loss:.3f}) |",
    ]
    for folder in sorted((results / "from-scratch").iterdir()):
        bleu_file = folder / "bleu.txt"
        if not (folder / "kept-heads.json").is_file():
            continue
        kept = kept_sets_from_json(folder / "kept-heads.json", layers, heads)
        match = [r for r in l0 if kept_sets_from_masked(r.get("masked", ""), layers, heads) == kept]
        if len(match) != 1:
            print(f"voita_from_scratch_table: error: {folder.name}'s heads match {len(match)} L0 runs, not one",
                  file=sys.stderr)
            return 2
        run = match[0]
        per_type = " / ".join(str(sum(len(h) for h in kept[t].values())) for t in TYPES)
        n_kept = sum(len(h) for t in TYPES for h in kept[t].values())
        vs_control = f"{run['bleu'] - control['bleu']:+.2f}" if control else ""
        if bleu_file.is_file():
            scratch = float(bleu_file.read_text().split("\t")[2])
            epochs, best = training_summary(folder / "train-progress.log")
            scratch_cells = f"{scratch:.2f} | {scratch - base['bleu']:+.2f} | {epochs} ({best:.3f})"
        else:
            scratch_cells = "training | | "
        lines.append(f"| {folder.name} | {n_kept} ({per_type}) | {run['l0_lambda']:g} | {run['bleu']:.2f} | "
                     f"{vs_control} | {scratch_cells} |")
    table = "\n".join(lines) + "\n"
    (results / "from-scratch" / "table.md").write_text(table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:] + ["results/voita", "results/de-en/convergence/valid-loss.txt"][len(sys.argv) - 1:]
    sys.exit(main(Path(args[0]), Path(args[1])))
