"""The contract every compress stage keeps. A Stage is a name; its inputs, a dataclass of what it reads (from the
run's Context and the typed results of the stages before it, by content and value), whose fields are its identity;
and a build that returns its typed result (compress.stages.results) from the same; optionally the refusals it makes
in its turn, the key under which its own unfinished work is kept (a resumable stage), and what follows from its
result once it is held (built or cached). compress.pipeline runs the list in order, caches each result under its
identity, resumes at the first stage not done and stops after any; no stage reads another's internals, only the
results before it (no stage module imports another: tests/test_architecture.py)."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from fairseq_headprune.compress.stages.results import Choice, StageResult
from fairseq_headprune.records.log import read_json

Results = Dict[str, StageResult]  # the results of the stages run so far, by stage name


@dataclass(frozen=True)
class Inputs:
    """What a stage reads, field by field: its identity is every field by value, a None field left out (a field
    added later is None by default, so the records of runs before it still resume). A stage whose identity another
    record shares (the cost table's, which its cache outside OUT is keyed by) gives it whole as `identity`. Each
    stage's identity is stored after the digest of the record before it (Run.run_stage), so what an earlier stage
    read (the engine, the threads, the timing batches and rounds: the cost table's) is held by the chain; a stage's
    inputs add what no stage before it read (the measure's other batch and its --runs, the export's map bound)."""

    def identity(self) -> Dict:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class Context:
    """What every stage may read besides the results before it: the unpruned model as loaded, the options as given,
    the timing batches and rounds, the cost table's identity, the recovery's torch threads, the run's stages
    folder and its log; and `trim`, the lever value every shape of the run takes ({"vocab_percent": P} under
    --keep-vocab: stages.common.trim_point)."""
    loaded: Any
    options: Any
    timing: List
    rounds: int
    table_identity: Dict
    threads: int
    stages_root: str
    log: Callable[[str], None]
    trim: Dict[str, float] = dataclasses.field(default_factory=dict)

    def quiet(self) -> "Context":
        """The same context with no log (the plan computes identities it does not report)."""
        return dataclasses.replace(self, log=lambda line: None)

    def folder(self, name: str) -> str:
        return os.path.join(self.stages_root, name)

    def held(self, name: str) -> Optional[Dict]:
        """A stage's record as the run folder holds it, whatever its identity (a recovery's budget is checked
        against it)."""
        return read_json(os.path.join(self.folder(name), "stage.json"))

    def shipped(self, results: Results):
        """The options the stages after the choice read (shipped)."""
        return shipped(self.options, results.get("choice"))


def shipped(options, choice: Optional[Choice]):
    """The options the stages after the choice read: the vocabulary map on where the choice weighed it and took it
    (the export ships it, the measure and the report decode with it), else as given."""
    if choice and choice.maps and not options.vocab_map:
        return dataclasses.replace(options, vocab_map=True)
    return options


@dataclass(frozen=True)
class Stage:
    """One stage: `inputs(context, results)` what it reads (its identity: Inputs.identity); `build(folder, inputs,
    context, results)` its result, of type `result`; `check(context, inputs)` its refusals, made in its turn before
    anything runs; `resume_key(inputs)` the key under which its unfinished work is kept; `after(context, results)`
    what follows from its result once held (logged lines, the run's refusals, files a --stop-after leaves). The
    inputs are read once a run."""
    name: str
    inputs: Callable[[Context, Results], Inputs]
    build: Callable[[str, Any, Context, Results], StageResult]
    result: type
    check: Optional[Callable[[Context, Any], None]] = None
    resume_key: Optional[Callable[[Any], Optional[Dict]]] = None
    after: Optional[Callable[[Context, Results], None]] = None
