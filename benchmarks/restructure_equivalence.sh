#!/usr/bin/env bash
# The restructure's equivalence check: the same small study (the demo's command on 8 sentences) with the code
# before the restructure (commit 7bf874c, checked out at work/old) and after; rows compared by benchmarks/restructure_compare_rows.py.
set -euo pipefail
cd .
export OMP_NUM_THREADS=1
ARGS=(work/smoke/data-bin --path checkpoints/de-en/model.pt --gen-subset test --beam 1 --max-len-a 1.2 --max-len-b 10
  --max-tokens 4000 --bpe subword_nmt --bpe-codes checkpoints/de-en/code --tokenizer moses -s de -t en
  --references work/smoke/test.en --prune-step 0.5 --speed-sentences 8 --speed-runs 1 --speed-batch-sizes 4
  --analyze-sentences 4 --dynamics results/dynamics/dynamics.jsonl --keep-one-select loss)
rm -rf work/eq-old work/eq-new
.venv/bin/python -c "import sys; sys.path.insert(0, 'work/old'); from fairseq_headprune.cli import main; import fairseq_headprune; assert fairseq_headprune.__file__.startswith('work/old'); sys.exit(main(sys.argv[1:]))" report "${ARGS[@]}" --results-dir work/eq-old > work/eq-old.log 2>&1
.venv/bin/fairseq-headprune report "${ARGS[@]}" --results-dir work/eq-new > work/eq-new.log 2>&1
echo finished
