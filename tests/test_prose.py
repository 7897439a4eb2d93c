"""The pages a reader reads (README.md, docs/, every results README) say what was run and when, never the work
period, the tree snapshot or the tracker issue it happened in: those mean something to the author only."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "results").glob("**/README.md"),
                *(ROOT / "results").glob("**/NOTES.md")])
# a work period ("session 9", "the fifth session"), a snapshot's name ("snap23"), a control named by its epoch
# ("ctl-e8"), a tracker issue ("issue 41's", "the issue sets", "#41")
AUTHOR_WORDS = re.compile(r"\bsessions?\b|\bwork periods?\b|\bsnap\d+|\bctl-e\d+|\bissues?\b|(?<![\w&])#\d+\b",
                          re.IGNORECASE)


def author_words(text):
    """(line number, line) of every line naming a work period, a snapshot or an issue."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if AUTHOR_WORDS.search(line)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_names_no_work_period_snapshot_or_issue(page):
    found = author_words(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)}: say what was done and when instead of: " + "; ".join(
        f"line {n}: {line[:100]}" for n, line in found)


def test_the_pattern_catches_the_author_words_and_leaves_the_reader_words():
    caught = ["(session 9's choice)", "Later in the session", "the fifth session", "from snapshot snap23",
              "control-adjusted with ctl-e8", "Issue 41's targets", "the budget the issue sets", "(issues 40, 41)",
              "fixed in #17"]
    kept = ["run it from a snapshot of the committed tree", "a CTranslate2 model of any checkpoint",
            "the 8-epoch 4 x 3 run", "[setup](docs/development.md#setup)", "&#38; entities", "1.5x within 0.2"]
    assert [t for t in caught if not author_words(t)] == []
    assert [t for t in kept if author_words(t)] == []


def test_every_reader_page_is_checked():
    names = {str(p.relative_to(ROOT)) for p in PAGES}
    assert {"README.md", "docs/development.md", "results/README.md", "results/compress-de-en/README.md",
            "results/shrink-de-en/NOTES.md"} <= names and len(names) > 30
