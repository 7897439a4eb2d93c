# The De-En training recipe's model shape and hyper-parameters, shared by recipes/train_de_en.sh (the bundled
# model) and recipes/voita_from_scratch.sh (pruned configurations trained from scratch with the same recipe).
# Sourced, not run: defines DE_EN_TRAIN_ARGS.
# Shape: the papers' 6+6 layers with 8 heads in every attention (144 heads), scaled to this CPU: d_model 256,
# FFN 512 (the IWSLT model's 512/1024 halved), pre-norm as in Michel et al.'s IWSLT model.
DE_EN_TRAIN_ARGS=(
  --share-all-embeddings
  --encoder-layers 6 --decoder-layers 6 --encoder-attention-heads 8 --decoder-attention-heads 8
  --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512
  --encoder-normalize-before --decoder-normalize-before
  --dropout 0.3 --attention-dropout 0.1 --activation-dropout 0.1 --weight-decay 0.0001
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0
  --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 800 --warmup-init-lr 1e-07
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1
  --max-tokens 2048 --seed 1
  --log-format simple --log-interval 50 --num-workers 0
)
# Phase two (recipes/cooldown_de_en.sh): the same run at a constant lr of 1e-4, the lr every fine-tuning of the
# pruning studies uses (recipes/voita_l0.sh), until the valid loss stops improving. It replaces phase one's
# schedule options; --warmup-updates 0, or the fixed schedule would ramp up from 0 again.
DE_EN_COOLDOWN_ARGS=(--lr-scheduler fixed --lr 1e-4 --warmup-updates 0 --reset-lr-scheduler)
# Phase one ran 19 epochs (cut there when the lambda = 0 control said it was not converged: results/de-en/convergence)
DE_EN_PHASE1_EPOCHS=19
# phase one's arguments without its schedule (inverse_sqrt's --warmup-init-lr is not an option of `fixed`)
DE_EN_COOLDOWN_BASE=()
_skip=0
for _arg in "${DE_EN_TRAIN_ARGS[@]}"; do
  if (( _skip )); then _skip=0; continue; fi
  case $_arg in --lr|--lr-scheduler|--warmup-updates|--warmup-init-lr) _skip=1; continue ;; esac
  DE_EN_COOLDOWN_BASE+=("$_arg")
done
unset _skip _arg
