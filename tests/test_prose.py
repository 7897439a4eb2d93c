"""The pages a reader reads (README.md, docs/, every results README) say what was run and when, never the work
period, the tree snapshot or the tracker issue it happened in: those mean something to the author only."""
import re
import subprocess
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


# an absolute path of the machine a file was made on (a home, a work or scratch folder); fairseq's own default
# "/tmp/plasma" (the plasma store of its checkpoint config) names no machine
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|Users|root|scratch|mnt|tmp(?!/plasma))/[\w.-]+")
TEXT_SUFFIXES = {".md", ".json", ".jsonl", ".log", ".txt", ".html", ".csv", ".tsv", ".sh", ".py", ".cfg", ".toml"}


def committed_text_files():
    """Every file git tracks whose name says it is text."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted(ROOT / n for n in names.split("\0") if n and Path(n).suffix in TEXT_SUFFIXES)


def test_no_committed_text_file_holds_a_machine_path():
    found = []
    for path in committed_text_files():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            match = MACHINE_PATH.search(line)
            if match and path.name != "test_prose.py":
                found.append(f"{path.relative_to(ROOT)}:{n}: {match.group(0)}")
    assert not found, f"{len(found)} machine paths (write them relative to the repository): " + "; ".join(found[:20])


def test_the_machine_path_pattern():
    caught = ["--save-dir /work/main/work/x", '"/home/me/model.pt"', "/tmp/old/ckpt.pt", "from /work/snap12/ckpt"]
    kept = ["--plasma-path /tmp/plasma", "work/compress-de-en/data-bin", "../shared/data/multi30k", "a/work/b",
            "https://example.org/home/page"]
    assert [t for t in caught if not MACHINE_PATH.search(t)] == []
    assert [t for t in kept if MACHINE_PATH.search(t)] == []
