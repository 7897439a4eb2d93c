"""`report` refusals in one line before the model loads."""
from __future__ import annotations

from conftest import run


def test_an_oracle_order_without_the_single_head_ablation_is_one_line(tiny_data, stock_checkpoint, tmp_path):
    """--prune-orders oracle reads ablation-single.jsonl: without the single part (and no file from an earlier run)
    the report is refused before the model loads, not stopped by a FileNotFoundError after the first parts."""
    proc = run(["fairseq-headprune", "report", tiny_data, "--path", stock_checkpoint, "--results-dir",
                tmp_path / "study", "--parts", "score,prune"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--prune-orders oracle reads the single-head ablation" in proc.stderr.strip().splitlines()[-1]
