"""compress's stages, one module each, each declaring its STAGE as the contract says (contract.Stage: its Inputs,
whose fields are its identity, its build returning its typed result, both from the run's Context and the results
of the stages before it); beside them the modules two stages share (no stage module imports another).
compress.pipeline runs them in order, caches each and logs.

  contract       Stage, Inputs, Context (what every stage may read) and the options as shipped after the choice
  results        what each stage hands on: CostTable, Choice, Shrunk, Recovered, Exported, Measured, Reported
  common         what several stages read alike (batch and thread settings, subset sizes and digests, engine
                 models, the lever value every shape takes, the timings' vocabulary map)
  points         the shapes a run chooses among, with their predicted speed (or --shape's point)
  shrink_recipe  the one place compress builds shrink's options, and a shape shrunk with them
  recovery       the recovery set, its key, RecoverOptions and the fairseq-train command
  heldout        the held-out split of valid (--max-bleu-loss) and a checkpoint's score on it
  plan           the rates measured now and each stage's estimate; --dry-run's lines
  cost_table     stage: what each lever buys in the engine
  choice         stage: the shape and its heads (--speedup: timed again; --max-bleu-loss: bisection on held-out BLEU)
  shrink         stage: the shape removed and the model reconstructed
  recover        stage: the distillation on fairseq-train, or --recovered adopted
  elsewhere      the recovery to run elsewhere: OUT/recovery-run/ (its script and every file it reads)
  export         stage: the CTranslate2 model, checked against fairseq
  measure        stage: speed over the unpruned model in the same engine; the FLOP ratio
  report         stage: the reported sets decoded once by both models: BLEU and paired-bootstrap p
  outputs        OUT/model.pt, OUT/ct2/, OUT/MODEL_CARD.md and OUT/compress.json with its verdict
"""
