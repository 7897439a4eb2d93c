"""What the documented-commands tests rely on (tests/documented_commands_runner.py): every document with a fenced
`bash` block is run by exactly one of tests/test_documented_commands_GROUP.py, every NOT_RUN line is still
documented, and the recipe that runs the README's compress line takes it as the tests do. The commands themselves
run in those files."""
from __future__ import annotations

import subprocess
import sys

from documented_commands_runner import DOCUMENTS, GROUPS, NOT_RUN, fenced_commands
from conftest import ROOT


def test_every_document_with_commands_is_run_by_one_test_file():
    assigned = [doc for documents in GROUPS.values() for doc in documents]
    with_commands = {doc for doc in DOCUMENTS if fenced_commands(ROOT / doc)}
    assert len(assigned) == len(set(assigned)) and set(assigned) == with_commands, (sorted(assigned),
                                                                                    sorted(with_commands))
    files = {path.name for path in (ROOT / "tests").glob("test_documented_commands_*.py")}
    assert files == {f"test_documented_commands_{group}.py" for group in GROUPS}, files


def test_every_line_not_run_is_still_documented():
    every = {c for doc in DOCUMENTS for c in fenced_commands(ROOT / doc)}
    assert set(NOT_RUN) <= every, sorted(set(NOT_RUN) - every)


def test_every_page_but_development_and_reliability_has_a_command_that_runs():
    """A page's commands as `text` synopses only would leave them untested."""
    for doc in DOCUMENTS:
        runnable = [c for c in fenced_commands(ROOT / doc) if c not in NOT_RUN]
        assert runnable or doc in ("docs/development.md", "docs/reliability.md"), doc


def test_the_readme_compress_line_as_the_recipe_takes_it():
    """recipes/readme_compress_de_en.sh runs the README's compress line on the bundled model: the tool it takes the
    line from gives one compress command, after the DEC it reads, with the placeholders replaced and nothing else."""
    from documented_commands import with_placeholders

    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "documented_commands.py"), str(ROOT / "README.md"),
                           "--starting", "fairseq-headprune compress", "--assignments", "--set", "DATA=data-bin",
                           "--set", "model.pt=m/model.pt", "--set", "MODEL_DIR=m"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    written = [c for c in fenced_commands(ROOT / "README.md") if c.startswith("fairseq-headprune compress")]
    assert len(written) == 1 and lines[-1] == with_placeholders(written[0], {"DATA": "data-bin",
                                                                             "model.pt": "m/model.pt"})
    assert lines[-1].startswith("fairseq-headprune compress data-bin --path m/model.pt ") and "$DEC" in lines[-1]
    assert any(line.startswith("DEC=") and "--bpe-codes m/code" in line for line in lines[:-1])
    bad = subprocess.run([sys.executable, str(ROOT / "tools" / "documented_commands.py"), "nowhere.md"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_the_forked_cli_keeps_the_shells_redirections_pipes_and_exit_codes(tmp_path):
    """tests/forked_cli.py: a line's `fairseq-headprune` served by a forked child, its redirections, pipes and exit
    code as bash gives them; a line whose environment differs runs the installed console script instead."""
    import os

    from conftest import BIN, ENV
    from forked_cli import ForkedCli

    env = {**ENV, "PATH": f"{BIN}{os.pathsep}{ENV.get('PATH', '')}"}
    with ForkedCli(tmp_path / "cli", env) as cli:
        def bash(line: str) -> subprocess.CompletedProcess:
            return subprocess.run(["bash", "-c", line], cwd=tmp_path, env=cli.env, capture_output=True, text=True)

        refused = bash("fairseq-headprune bogus 2> err.txt; echo $?")
        assert refused.stdout == "2\n" and (tmp_path / "err.txt").read_text().startswith(
            "fairseq-headprune: error: unknown command 'bogus'")
        piped = bash("fairseq-headprune --help | head -1")
        assert piped.returncode == 0 and piped.stdout.startswith("usage: fairseq-headprune COMMAND"), piped
        assert bash("echo x | fairseq-headprune translate nowhere/ > out.txt").returncode == 2
        assert (tmp_path / "out.txt").read_text() == ""
        served = cli.served()
        assert served == 3, served
        elsewhere = bash("LOGLEVEL=INFO fairseq-headprune bogus")  # another environment: the installed script
        assert elsewhere.returncode == 2 and "unknown command 'bogus'" in elsewhere.stderr
        assert cli.served() == served


def test_forked_console_scripts_answer_as_the_installed_ones_and_pass_on_signals(tiny_data, stock_checkpoint):
    """conftest.run's forked fairseq-generate gives the installed script's hypotheses and its exit code; Ctrl-C sent
    to a client ends its child as the interpreter ends a script it interrupts (an uncaught KeyboardInterrupt, then
    killed by SIGINT); calls run at once; a killed client takes its child with it. The fresh fairseq-interactive is
    not the reference for Ctrl-C: in some whole-suite runs it ignored the signal and ended at end of input."""
    import signal
    import time

    from conftest import _forked, run

    generate = ["fairseq-generate", tiny_data, "--path", stock_checkpoint, "--gen-subset", "valid", "--beam", "2",
                "--max-tokens", "400", "--max-sentences", "4", "--skip-invalid-size-inputs-valid-test"]
    forked, fresh = run(generate), run(generate, in_process=False)
    hypotheses = [line for line in forked.stdout.splitlines() if line.startswith(("H-", "D-"))]
    assert hypotheses and hypotheses == [line for line in fresh.stdout.splitlines() if line.startswith(("H-", "D-"))]
    refused = [run(["fairseq-generate", tiny_data, "--path", "nosuch.pt"], check=False, in_process=flag)
               for flag in (True, False)]
    assert refused[0].returncode == refused[1].returncode != 0
    assert refused[0].stderr.splitlines()[-1] == refused[1].stderr.splitlines()[-1]

    cli = _forked("fairseq-interactive")
    interactive = [tiny_data, "--path", stock_checkpoint, "-s", "de", "-t", "en"]
    waiting = _prompted([str(cli.client), *interactive], cli.env)
    assert run(["fairseq-interactive", *interactive], input="ein Hund\n").stdout.count("\nH-0\t") == 1
    waiting.send_signal(signal.SIGINT)  # Ctrl-C while it waits for input (after another call ran beside it)
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == -signal.SIGINT and err.splitlines()[-1:] == ["KeyboardInterrupt"], (out, err)
    killed = _prompted([str(cli.client), *interactive], cli.env)
    assert _children(cli.server.pid)
    killed.kill()
    killed.wait()
    deadline = time.time() + 30
    while _children(cli.server.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not _children(cli.server.pid)


def _prompted(command, env) -> subprocess.Popen:
    """fairseq-interactive started, once it asks for input (in its log, on stderr)."""
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True)
    while "Type the input sentence" not in (line := proc.stderr.readline()):
        assert line, proc.communicate()
    return proc


def _children(pid: int):
    from pathlib import Path

    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
