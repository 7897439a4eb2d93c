"""The contract every compress stage keeps. A Stage is a name, what it reads (its identity: from the run's Context
and the results of the stages before it, by content and value) and a build that returns its result from the same;
optionally the refusals it makes in its turn, the key under which its own unfinished work is kept (a resumable
stage), and what follows from its result once it is held (built or cached). compress.pipeline runs the list in
order, caches each result under its identity, resumes at the first stage not done and stops after any; no stage
reads another's internals, only the results before it."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from fairseq_headprune.prune import levers
from fairseq_headprune.records.log import read_json

Results = Dict[str, Dict]  # the results of the stages run so far, by stage name


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


def shipped(options, choice_result: Optional[Dict]):
    """The options the stages after the choice read: the vocabulary map on where the choice weighed it and took it
    (the export ships it, the measure and the report decode with it), else as given."""
    if choice_result and choice_result["chosen"].get(levers.MAP) and not options.vocab_map:
        return dataclasses.replace(options, vocab_map=True)
    return options


@dataclass(frozen=True)
class Stage:
    """One stage: `identity(context, results)` what it reads; `build(folder, context, results)` its result;
    `check(context, identity)` its refusals, made in its turn before anything runs; `resume_key(identity)` the key
    under which its unfinished work is kept; `after(context, results)` what follows from its result once held
    (logged lines, the run's refusals, files a --stop-after leaves). The identity is computed once a run."""
    name: str
    identity: Callable[[Context, Results], Dict]
    build: Callable[[str, Context, Results], Dict]
    check: Optional[Callable[[Context, Dict], None]] = None
    resume_key: Optional[Callable[[Dict], Optional[Dict]]] = None
    after: Optional[Callable[[Context, Results], None]] = None
