"""What each stage hands on: its result as a typed dataclass, the fields the stages after it read, beside `record`,
the whole result as the stage's record and compress.json keep it (what the card reads). A stage builds its result
from the record it writes (`of`); the run reads it back the same way from OUT/stages/NAME/stage.json, its paths
resolved against OUT where it is now."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional

from fairseq_headprune.compress.choice import Candidate


@dataclass(frozen=True)
class StageResult:
    """A stage's result: `record`, as stored; the typed fields below it, read from the record by name."""
    record: Dict

    @classmethod
    def of(cls, record: Dict) -> "StageResult":
        typed = {f.name: record.get(f.name) for f in dataclasses.fields(cls) if f.name != "record"}
        return cls(record=record, **typed)

    def with_record(self, **more) -> "StageResult":
        """The same result, its record holding `more` too (the run adds the stage's seconds)."""
        return type(self).of({**self.record, **more})


@dataclass(frozen=True)
class CostTable(StageResult):
    """The cost table (prune.levers.cost_table) as its record: its rows, what it was measured on, where it is
    cached (compress.stages.points reads it whole)."""


@dataclass(frozen=True)
class Choice(StageResult):
    """The chosen candidate (compress.choice.Candidate: its shape and map, its heads and kept layers, its predicted
    and measured speed); with --max-bleu-loss, the held-out split of valid it was chosen on (`data`, `split`), its
    metric and the unpruned model's score there."""
    chosen: Candidate
    data: Optional[str] = None
    split: Optional[Dict] = None
    metric: Optional[str] = None
    heldout_unpruned: Optional[float] = None

    @classmethod
    def of(cls, record: Dict) -> "Choice":
        choice = dataclasses.replace(super().of(record), chosen=Candidate.of(record["chosen"]))
        if not choice.data:
            return choice
        unpruned = choice.heldout_unpruned  # (choices recorded before --max-chrf-loss: BLEU, under another name)
        if unpruned is None:
            unpruned = record.get("heldout_bleu_unpruned")
        return dataclasses.replace(choice, metric=choice.metric or "BLEU", heldout_unpruned=unpruned)

    @property
    def maps(self) -> bool:
        """Whether the chosen shape ships the vocabulary map."""
        return self.chosen.vocab_map

    @property
    def shrunk(self) -> Optional[Dict]:
        """The choice's own shrink of the chosen heads (--max-bleu-loss's probe), with the shrink stage's options."""
        return self.chosen.shrunk


@dataclass(frozen=True)
class Shrunk(StageResult):
    """The shrunk model: its checkpoint and digest, the layers it kept and the teacher layer each stands for."""
    checkpoint: str
    checkpoint_sha256: str
    layers: Optional[Dict] = None


@dataclass(frozen=True)
class Recovered(StageResult):
    """The recovered model (the shrunk one itself under --budget-epochs 0) and the budget it was trained under."""
    checkpoint: str
    checkpoint_sha256: str
    budget_epochs: Optional[int] = None


@dataclass(frozen=True)
class Exported(StageResult):
    """The model as the engine runs it: the CTranslate2 folder (None for --engine fairseq); under --keep-vocab the
    trimmed checkpoint and its dictionaries."""
    engine: str
    ct2: Optional[str] = None
    checkpoint: Optional[str] = None
    dictionaries: Optional[List[str]] = None


@dataclass(frozen=True)
class Measured(StageResult):
    """The speed over the unpruned model (read by the outputs and the card only)."""


@dataclass(frozen=True)
class Reported(StageResult):
    """The reported sets' BLEU and chrF against the unpruned model (read by the outputs and the card only)."""


def shipped_checkpoint(results: Dict[str, StageResult]) -> str:
    """The checkpoint that ships: the export's (its vocabulary trimmed by --keep-vocab), else the recovered one."""
    return results["export"].checkpoint or results["recover"].checkpoint
