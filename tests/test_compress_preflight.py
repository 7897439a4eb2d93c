"""`compress` as safe as the commands it chains: never over a user's files, every refusal before the first stage
(references, --recover-args, BPE files, numbers that no run can mean), one line for every usage error of every
command, and every float option of every command finite."""
from __future__ import annotations

import hashlib
import importlib
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import run
from test_compress import compress_argv

from fairseq_headprune import cli
from fairseq_headprune.compress import preflight
from fairseq_headprune.compress.options import CompressOptions
from fairseq_headprune.errors import UserError
from fairseq_headprune.options import finite_float, non_finite
from fairseq_headprune.prune.window_fit import WindowOptions


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line(proc, command: str = "compress") -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(f"fairseq-headprune {command}: error: "), lines[0]
    return lines[0]


def _compress(data, checkpoint, out, cache, *extra, target=("--speedup", "1.2")):
    return run(compress_argv(data, checkpoint, out, cache, *extra, target=target), check=False)


# --------------------------------------------------------------------------------------------- --out


def test_compress_never_writes_over_a_users_files(tiny_data, stock_checkpoint, tmp_path):
    cache = tmp_path / "cache"
    holder = tmp_path / "mine"  # the user's model beside their own card: --out is the folder of --path
    holder.mkdir()
    checkpoint = holder / "model.pt"
    shutil.copyfile(stock_checkpoint, checkpoint)
    (holder / "MODEL_CARD.md").write_text("my card\n")
    notes = tmp_path / "notes"  # a folder of the user's
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    earlier = tmp_path / "earlier"  # a compress run's folder, a user's file put under its ct2/
    (earlier / "stages").mkdir(parents=True)
    (earlier / "ct2").mkdir()
    for name in ("config.json", "model.bin", "shared_vocabulary.json"):
        (earlier / "ct2" / name).write_text("x")
    (earlier / "ct2" / "README").write_text("mine")
    lookalike = tmp_path / "lookalike"  # compress's names, no records of a compress run
    lookalike.mkdir()
    (lookalike / "model.pt").write_text("the user's")
    cases = [(holder, checkpoint, "is or holds an input of this run"), (notes, stock_checkpoint, "notes.txt"),
             (earlier, stock_checkpoint, "ct2/README"), (tiny_data, stock_checkpoint, "is or holds an input"),
             (lookalike, stock_checkpoint, "model.pt (no stages/ beside it")]
    for out, path, why in cases:
        before = _tree(out)
        line = _one_line(_compress(tiny_data, path, out, cache))
        assert str(out) in line and why in line, line
        assert _tree(out) == before, f"{out} changed"
    for out, why in ((checkpoint / "sub", "is not a folder"), (tmp_path / "no" / "sub", "does not exist")):
        line = _one_line(_compress(tiny_data, stock_checkpoint, out, cache))
        assert why in line, line
    assert not cache.exists()  # refused before any measurement


def test_compress_writes_into_a_new_folder_or_one_of_its_own_runs(tmp_path):
    preflight.output_folder(str(tmp_path / "new"))
    (tmp_path / "empty").mkdir()
    preflight.output_folder(str(tmp_path / "empty"))
    own = tmp_path / "own"  # what a run leaves: its records, outputs, lock and temporaries of a killed write
    (own / "stages" / "choice").mkdir(parents=True)
    (own / "ct2").mkdir()
    for name in ("config.json", "model.bin", "shared_vocabulary.json"):
        (own / "ct2" / name).write_text("x")
    for name in ("model.pt", "MODEL_CARD.md", "compress.json", ".fairseq-headprune.lock", "model.pt.tmp",
                 ".MODEL_CARD.md.ab12.tmp"):
        (own / name).write_text("x")
    (own / ".ct2-x1y2").mkdir()
    preflight.output_folder(str(own))
    killed = tmp_path / "killed"  # a run killed before its first stage
    killed.mkdir()
    (killed / ".fairseq-headprune.lock").write_text("1\n")
    preflight.output_folder(str(killed))
    with pytest.raises(UserError, match="is or holds an input"):
        preflight.output_folder(str(own), [str(own / "stages" / "data")])


def test_a_second_compress_of_one_out_is_told_to_use_another_out(tiny_data, stock_checkpoint, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, time\n"
        f"fd = os.open({str(out / '.fairseq-headprune.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        line = _one_line(_compress(tiny_data, stock_checkpoint, out, tmp_path / "cache"))
        assert "being written by another" in line and "use another --out" in line, line
        assert sorted(p.name for p in out.iterdir()) == [".fairseq-headprune.lock"]
    finally:
        holder.kill()
        holder.wait()


# --------------------------------------------------------------------------------------------- before any stage


def test_every_input_a_later_stage_reads_is_refused_before_the_first_stage(tiny_data, stock_checkpoint, tmp_path):
    data = tmp_path / "data"  # the tiny data with a second reported set (the test sentences under another name)
    data.mkdir()
    for path in tiny_data.iterdir():
        if path.name.startswith("second."):  # another test's second set in the shared data: made here again
            continue
        (data / path.name).symlink_to(path)
        if path.name.startswith("test.de-en."):
            (data / path.name.replace("test.", "second.", 1)).symlink_to(path)
    short = tmp_path / "short.en"
    short.write_text("a\nb\nc\n")
    full = tmp_path / "full.en"
    full.write_text((tiny_data / "test.bpe.en").read_text())
    junk = tmp_path / "junk.codes"
    junk.write_text("not a codes file\n")
    gpus = torch.cuda.device_count()
    world = max(2, gpus + 1)
    not_a_checkpoint = tmp_path / "notes.pt"
    not_a_checkpoint.write_text("not a checkpoint\n")
    no_model = tmp_path / "no-model.pt"
    torch.save({"weights": {}}, no_model)
    empty, noise, nul = tmp_path / "empty.de", tmp_path / "noise.de", tmp_path / "nul.de"
    empty.write_text("")
    noise.write_bytes(bytes(range(128, 256)) * 8)
    nul.write_text("\0" * 200 + "ein Satz\n")
    cores = os.cpu_count() or 1
    cases = [
        (("--recover-args", "--lr 1e-4;"), "fairseq-train options: '1e-4;' is not a number or a list of numbers"),
        *([] if gpus else [(("--recover-args", f"--distributed-world-size {cores + 1}"),
                            f"--distributed-world-size {cores + 1} trains in {cores + 1} CPU processes and this "
                            f"machine has {cores} cores")]),
        (("--recovered", not_a_checkpoint), f"--recovered {not_a_checkpoint} is not a checkpoint torch can load"),
        (("--recovered", no_model), f"--recovered {no_model} is not a fairseq checkpoint"),
        (("--distill-source", empty), f"--distill-source {empty} is empty"),
        (("--distill-source", noise), f"--distill-source {noise} is not UTF-8 text"),
        (("--distill-source", nul), f"--distill-source {nul} is not text: 96% of its first characters"),
        (("--shape", "8/0x2"), "--shape 8/0x2: the decoder keeps 1 to 3 layers, not 0"),
        (("--shape", "8/2", "--recovered", stock_checkpoint),  # the unpruned model: not of the shape
         f"--recovered {stock_checkpoint} is not of --shape 8/2: decoder layer 1's self_attn holds 4 heads, the "
         "shape 2"),
        (("--shape", "8/2x4", "--recovered", stock_checkpoint),
         f"--recovered {stock_checkpoint} is not of --shape 8/2x4: its decoder has 3 layers, the shape 2"),
        (("--references", short), f"--references {short} has 3 lines but subset 'test' has"),
        (("--references", full, "--also-report", "second", "--also-references", short),
         f"--also-references {short} has 3 lines but subset 'second' has"),
        (("--recover-args", "--max-tokens 5"), "--max-tokens 5 is below the longest sentence"),
        # (without a GPU the world size is CPU processes: test_compress_scale.py trains in two)
        *([(("--recover-args", f"--distributed-world-size {world}"),
            f"--distributed-world-size {world} needs {world} GPUs and this machine has {gpus}")] if gpus else []),
        (("--recover-args", "--valid-subset test"), "--valid-subset is set by compress itself"),
        (("--recover-args", "--max-update 5"), "--max-update is set by compress itself: use --budget-updates"),
        (("--recover-args", "--lr 'x"), "--recover-args --lr 'x: No closing quotation"),
        (("--recover-args", "--clip-norm nan"), "--clip-norm: 'nan' is not a finite number"),
        (("--recover-args", "--dropoutt 0.2"), "unknown option --dropoutt (did you mean --dropout?)"),
        (("--bpe", "subword_nmt", "--bpe-codes", junk), "--bpe subword_nmt cannot be built: Error: invalid line 1"),
        (("--window-lr", "nan"), "--window-lr: 'nan' is not a finite number"),
        (("--distill-hidden-weight", "nan"), "--distill-hidden-weight: 'nan' is not a finite number"),
    ]
    targets = [(("--max-bleu-loss", "nan"), "--max-bleu-loss: 'nan' is not a finite number"),
               (("--speedup", "inf"), "--speedup: 'inf' is not a finite number")]
    for n, (extra, message) in enumerate(targets + cases):
        out = tmp_path / f"out{n}"
        target = extra[:2] if extra[0] in ("--max-bleu-loss", "--speedup") else ("--speedup", "1.2")
        extra = extra[2:] if extra[0] in ("--max-bleu-loss", "--speedup") else extra
        line = _one_line(_compress(data, stock_checkpoint, out, tmp_path / "cache", *extra, target=target))
        assert message in line, (extra, line)
        assert not out.exists() and not (tmp_path / "cache").exists(), (extra, "work began")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    line = _one_line(_compress(data, stock_checkpoint, dangling, tmp_path / "cache"))
    assert f"--out {dangling} is a link to {tmp_path / 'nowhere'}, which does not exist" in line
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "cache").exists()


def test_options_of_a_library_caller_are_finite():
    with pytest.raises(UserError, match="--max-bleu-loss must be a finite number, not nan"):
        CompressOptions(out="x", max_bleu_loss=math.nan).check()
    with pytest.raises(UserError, match="--window-lr must be a finite number, not inf"):
        CompressOptions(out="x", speedup=1.5, window=WindowOptions(lr=math.inf)).check()
    non_finite(CompressOptions(out="x", speedup=1.5))
    assert finite_float("1e-4") == 1e-4


# --------------------------------------------------------------------------------------------- every command


def test_a_usage_error_of_any_command_is_one_line(tiny_data, stock_checkpoint, tmp_path):
    for command in cli.COMMANDS:
        line = _one_line(run(["fairseq-headprune", command, "--no-such-option"], check=False), command)
        assert "--no-such-option" in line or "required" in line, line
    base = compress_argv(tiny_data, stock_checkpoint, tmp_path / "out", tmp_path / "cache")
    line = _one_line(run(base + ["--stop-after", "bogus"], check=False))
    assert "argument --stop-after: invalid choice: 'bogus'" in line
    line = _one_line(run(base + ["--stop-afte", "report"], check=False))
    assert line.endswith("unknown option --stop-afte (did you mean --stop-after?)"), line
    line = _one_line(run(["fairseq-headprune", "shrink", tiny_data, "--path", stock_checkpoint, "--remove", "50%",
                          "--out", tmp_path / "s.pt", "--layer-selection", "bogus"], check=False), "shrink")
    assert "argument --layer-selection: invalid choice: 'bogus'" in line
    line = _one_line(run(["fairseq-headprune", "recover", tiny_data, "--path", stock_checkpoint, "--teacher",
                          stock_checkpoint, "--out", tmp_path / "r.pt", "--dropoutt", "0.1"], check=False),
                     "recover")
    assert "unknown option --dropoutt (did you mean --dropout?)" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "r.pt").exists()


def _float_options(parser):
    return [a for a in parser._actions if parser._registry_get("type", a.type, a.type) is finite_float]


@pytest.mark.parametrize("command", [c for c in cli.COMMANDS if c != "recover"])
def test_every_float_option_of_every_command_is_finite(command):
    parser = cli.parser_for(command, importlib.import_module(cli.COMMANDS[command][0]))
    floats = [a for a in parser._actions if a.type in (float, finite_float)]
    assert _float_options(parser) == floats  # fairseq's (--lenpen, ...) and the command's own
    assert floats or not getattr(importlib.import_module(cli.COMMANDS[command][0]), "USES_FAIRSEQ_OPTIONS", True)
    for action in floats:
        for value in ("nan", "inf", "-inf"):
            with pytest.raises(UserError, match=f"argument {action.option_strings[0]}: '{value}' is not a finite"):
                parser.parse_known_args([f"{action.option_strings[0]}={value}"])


def test_every_float_option_of_recover_is_finite():
    from fairseq_headprune.cli import recover

    for flag in ("--distill-weight", "--distill-temperature", "--distill-hidden-weight"):
        with pytest.raises(UserError, match=f"argument {flag}: 'nan' is not a finite number"):
            recover.parse_argv(["data", "--path", "p.pt", "--out", "o.pt", flag, "nan"])


def test_every_option_of_every_command_is_declared_once_on_a_dataclass():
    """No hand-written add_argument in cli/: each command's own options come from option() fields (the default
    the dataclass's, so every default of the command's own arguments in the parser is None or a switch's False)."""
    from fairseq import options as fairseq_options

    folder = Path(cli.__file__).parent
    assert [p.name for p in sorted(folder.glob("*.py")) if "add_argument(" in p.read_text()] == []
    fairseq_flags = {s for a in fairseq_options.get_generation_parser()._actions for s in a.option_strings}
    for command, (name, _) in cli.COMMANDS.items():
        parser = cli.parser_for(command, importlib.import_module(name))
        own = [a for a in parser._actions if a.dest != "help" and not set(a.option_strings) & fairseq_flags]
        assert own, command
        assert [a.dest for a in own if a.default not in (None, False)] == [], command


def test_the_probe_tool_replays_the_compress_cases():
    """`tools/probe_compression.py --only compress` (docs/reliability.md): every compress case held; those a test
    of this suite runs itself (the tool's COVERED_BY) are left to that test, which must exist."""
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "tools"))
    import probe_compression

    for name, test in probe_compression.COVERED_BY.items():
        path, function = test.split("::")
        assert f"\ndef {function}(" in (root / path).read_text(encoding="utf-8"), (name, test)
    assert probe_compression.main(["--only", "compress", "--skip-covered"]) == 0
