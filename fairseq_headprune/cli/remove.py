"""`fairseq-headprune remove --heads SPEC --out OUT.pt`: write a checkpoint whose given heads are physically gone."""
from __future__ import annotations

from dataclasses import dataclass

from fairseq_headprune.cli.common import output_checkpoint
from fairseq_headprune.options import add_arguments, from_arguments, option
from fairseq_headprune.errors import UserError
from fairseq_headprune.core.heads import parse_head_spec
from fairseq_headprune.fairseq_io.checkpoint_io import record_path_for
from fairseq_headprune.fairseq_io.loading import batches, load
from fairseq_headprune.studies.removal import remove_and_save


@dataclass
class RemoveArgs:
    """remove's options."""

    heads: str = option(flag="--heads", help="heads to remove: TYPE:LAYER:HEADS,... or @file.json")
    out: str = option(flag="--out", metavar="OUT.pt", help="the pruned checkpoint to write")


def add_args(parser) -> None:
    add_arguments(parser.add_argument_group("remove"), RemoveArgs)


def run(cfg, args) -> None:
    args = from_arguments(RemoveArgs, args)
    heads = parse_head_spec(args.heads)
    if not heads:
        raise UserError("--heads names no head")
    output_checkpoint("--out", args.out, cfg.common_eval.path or "")
    loaded = load(cfg)
    _, samples = batches(loaded, cfg.dataset.gen_subset)
    info = remove_and_save(loaded, heads, args.out, samples[0] if samples else None)
    print(f"removed {info['removed']} heads ({info['kept']} kept): {info['params_before']:,} -> "
          f"{info['params_after']:,} parameters; max logit difference to the masked model "
          f"{info['max_logit_diff']:.1e}\nwrote {args.out} (fairseq loads it with --user-dir fairseq_headprune) and "
          f"{record_path_for(args.out)}")
