"""compress's stages, one module each, each declaring its STAGE as the contract says (contract.Stage: its identity,
what its cached record is recognised by, and its build, both from the run's Context and the results of the stages
before it). compress.pipeline runs them in order, caches each and logs.

  contract    Stage, Context (what every stage may read) and the options as shipped after the choice
  common      what several stages read alike (batch and thread settings, subset sizes and digests, engine models)
  plan        the rates measured now and each stage's estimate; --dry-run's lines
  cost_table  what each lever buys in the engine, and the shapes that reach the target
  choice      the shape and its heads (--speedup: timed again; --max-bleu-loss: bisection on held-out BLEU)
  shrink      the shape removed and the model reconstructed; the one place compress builds shrink's options
  recover     the distillation on fairseq-train, or --recovered adopted; the recovery set; the recovery's command
  elsewhere   the recovery to run elsewhere: OUT/recovery-run/ (its script and every file it reads)
  export      the CTranslate2 model, checked against fairseq
  measure     speed over the unpruned model in the same engine; the FLOP ratio
  report      the reported sets decoded once by both models: BLEU and paired-bootstrap p
  outputs     OUT/model.pt, OUT/ct2/, OUT/MODEL_CARD.md and OUT/compress.json with its verdict
"""
