"""fairseq user module: `--user-dir fairseq_headprune` registers the task, models and criteria.

Importing it also lets fairseq's torch.load calls read fairseq checkpoints under torch >= 2.6
(see loading.trust_fairseq_checkpoints: checkpoints are trusted files).
"""
from fairseq_headprune.loading import trust_fairseq_checkpoints

trust_fairseq_checkpoints()

from fairseq_headprune.criterions import head_importance  # noqa: E402,F401
from fairseq_headprune.models import headprune_transformer  # noqa: E402,F401
from fairseq_headprune.tasks import translation_headprune  # noqa: E402,F401
