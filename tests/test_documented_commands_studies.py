"""The commands of the fenced `bash` blocks of docs/michel.md, docs/report.md and docs/voita.md, run as written on the
tiny models, one test case a document (tests/documented_commands_runner.py)."""
import pytest

from documented_commands_runner import GROUPS, run_document


@pytest.mark.parametrize("document", GROUPS["studies"])
def test_the_commands_of_the_document_run_as_written(document, stock_checkpoint, tmp_path):
    assert run_document(document, stock_checkpoint, tmp_path)
