"""The cost-table stage: what each lever buys in the engine (compress.levers: crude shapes at equal work,
interleaved; also cached per model, engine and CPU outside OUT), and the shapes that reach the target (or --shape's
point), refused in one line when none does."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Optional

from fairseq_headprune.prune import levers
from fairseq_headprune.compress.stages.common import data_sha, timing_vocab_map
from fairseq_headprune.compress.stages.contract import Context, Inputs, Results, Stage
from fairseq_headprune.compress.stages.points import announce_points
from fairseq_headprune.compress.stages.results import CostTable


def cost_cache(options) -> Optional[str]:
    """The folder of cost tables measured before: --cost-cache, the user's cache by default, none for ''."""
    given = options.cost_cache
    return levers.default_cache() if given is None else (given or None)


def table_identity(loaded, options, timing, rounds: int, trim: Dict[str, float]) -> Dict:
    """What the table's numbers depend on (levers.table_identity: with --keep-vocab, the output layer's row at the
    trim's share), and where the map is shipped or weighed its options and the training pairs it is built from
    (absent without it: the tables measured before still match)."""
    identity = levers.table_identity(loaded, options.engine, timing, rounds, levers.levers_for(trim),
                                     threads=options.deploy_threads)
    if options.map_state() != "off":
        identity["vocab_map"] = {**asdict(options.vocab_map_options), "train": data_sha(loaded, "train")}
    return identity


@dataclass(frozen=True)
class TableInputs(Inputs):
    """The table's identity, as the run's plan computed it (table_identity): the cache outside OUT is keyed by it."""
    table: Dict

    def identity(self) -> Dict:
        return self.table


def inputs(context: Context, results: Results) -> TableInputs:
    return TableInputs(context.table_identity)


def build(folder: str, inputs: TableInputs, context: Context, results: Results) -> CostTable:
    """The table: from the cache (or a cached table of a run that weighed the map, its map row dropped), or
    measured (and cached when every row is decided); where the map is shipped or weighed, a row for it
    (levers.MAP_ROW) and what it changes in the unpruned model's translations of the timing sentences."""
    loaded, options, log, identity = context.loaded, context.options, context.log, inputs.table
    cache = cost_cache(options)
    cached = levers.cached_table(cache, identity)
    if cached:
        reused = " with the vocabulary map's row; the other rows reused" if cached.pop("map_row_dropped", False) else ""
        log(f"cost table: measured before on this machine{reused} ({cache})")
        return CostTable.of({**cached, "from_cache": True})
    table = levers.cost_table(loaded, options.engine, context.timing, context.rounds, levers.levers_for(context.trim),
                              log=log, vocab_map=timing_vocab_map(loaded, options, folder),
                              threads=options.deploy_threads)
    if options.map_state() != "off":
        row = next(r for r in table["rows"] if r["field"] == levers.MAP)
        changes = row.get("translations", {})
        log(f"cost table: the vocabulary map {row['speedup']:.2f}x the unpruned model; it changes "
            f"{changes.get('differing')} of {changes.get('sentences')} of its translations of the timing sentences"
            + (f" (BLEU on the model's tokens {changes['bleu_without']:.2f} without, {changes['bleu_with']:.2f} "
               "with)" if "bleu_with" in changes else ""))
    table["identity"] = identity
    if not levers.decided(table):  # never cached: a rerun measures again rather than reuse an undecided table
        log(f"cost table: its rows saw as few as {levers.fewest_paired(table)} paired batches, fewer than "
            f"{levers.MIN_PAIRED}: not kept in the cache")
        return CostTable.of({**table, "from_cache": False, "cache_file": None})
    stored = levers.store_table(cache, table)
    return CostTable.of({**table, "from_cache": False, "cache_file": stored})


STAGE = Stage("cost-table", inputs, build, CostTable, after=announce_points)
