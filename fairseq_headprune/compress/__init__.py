"""The compress pipeline: a model for a stated speed or quality loss, built from the pruning library
(fairseq_headprune.prune) in cached, resumable stages.

  options       CompressOptions: the command's options
  preflight     every input checked before the first stage
  choice        which shape to build (from the cost table, timed again)
  stages        one module per stage of the run: cost_table, choice, shrink, recover, export, measure, report,
                outputs, and plan
  pipeline      the staged, resumable run that orders and caches them
  model_card    OUT/MODEL_CARD.md
"""
