"""fairseq user module: `--user-dir fairseq_headprune` registers the task, models and criteria.

Importing it also lets fairseq's torch.load calls read fairseq checkpoints under torch >= 2.6
(see loading.trust_fairseq_checkpoints: checkpoints are trusted files), and shows this module's usage errors in
fairseq's own commands as one line with exit code 2 (errors.report_user_errors).
"""
import logging

# fairseq's text-to-speech task logs an install hint for tensorboardX on every import; it concerns no user here
# (set before anything imports fairseq: the modules below do)
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)

from fairseq_headprune.errors import report_user_errors  # noqa: E402
from fairseq_headprune.fairseq_io.loading import trust_fairseq_checkpoints  # noqa: E402

trust_fairseq_checkpoints()
report_user_errors()

from fairseq_headprune.criterions import head_importance  # noqa: E402,F401
from fairseq_headprune.criterions import label_smoothed_cross_entropy_distill  # noqa: E402,F401
from fairseq_headprune.criterions import label_smoothed_cross_entropy_l0  # noqa: E402,F401
from fairseq_headprune.models import headprune_transformer  # noqa: E402,F401
from fairseq_headprune.tasks import translation_headprune  # noqa: E402,F401
from fairseq_headprune.tasks.any_task import register_all  # noqa: E402

register_all()  # NAME_headprune for every task: masks and gates under the task a model was trained with
