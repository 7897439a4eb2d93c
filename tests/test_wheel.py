"""The package as a user installs it: a wheel built from the tree, installed with pip into a fresh virtual
environment that already holds fairseq (the usual home of a `--user-dir` plugin), runs every command from there.

The fresh environment sees the test environment's packages through a .pth file (fairseq and its dependencies, as a
user's fairseq environment would hold them) but not this tree: pip installs the wheel offline and with its
dependencies checked, so a subpackage left out of the wheel or an import missing from install_requires fails here."""
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from conftest import ENV, ROOT


def _build_wheel(tmp: Path) -> Path:
    source = tmp / "source"  # a copy: building in the tree would leave build/ and egg-info behind
    source.mkdir()
    shutil.copy(ROOT / "setup.py", source)
    shutil.copytree(ROOT / "fairseq_headprune", source / "fairseq_headprune",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp / "dist"), str(source)], check=True, env=ENV, capture_output=True)
    return next((tmp / "dist").glob("fairseq_headprune-*.whl"))


def _fairseq_environment(tmp: Path) -> Path:
    """A new venv whose site-packages also reads the test environment's (fairseq and its dependencies); without
    a pip of its own, whose bundled setuptools would shadow the newer one torch requires."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([str(venv / "bin" / "python"), "-c", purelib], text=True).strip())
    (site / "fairseq-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


# prints the commands whose --help exits 0 with a usage (cli.main returns it, or argparse exits with it)
EVERY_HELP = """
import contextlib, io
from fairseq_headprune import cli
for name in sorted(cli.COMMANDS):
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            code = cli.main([name, "--help"])
    except SystemExit as e:
        code = e.code
    if code in (0, None) and "usage" in printed.getvalue():
        print(name)
"""


def test_the_wheel_installs_into_a_fairseq_environment_and_runs_every_command(tmp_path, stock_checkpoint,
                                                                               tiny_data):
    wheel = _build_wheel(tmp_path)
    packaged = {name.rsplit("/", 1)[0].replace("/", ".") for name in zipfile.ZipFile(wheel).namelist()
                if name.endswith("/__init__.py")}
    folders = {str(f.parent.relative_to(ROOT)).replace("/", ".") for f in (ROOT / "fairseq_headprune").rglob("*.py")}
    assert packaged == folders  # every folder of modules is a package in the wheel

    venv = _fairseq_environment(tmp_path)
    env = {k: v for k, v in ENV.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                              "-q", "--no-index", str(wheel)],
                             env=env, capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-2000:]  # every install_requires is met by the fairseq env

    where = subprocess.check_output([str(venv / "bin" / "python"), "-c",
                                     "import fairseq_headprune; print(fairseq_headprune.__file__)"],
                                    cwd=tmp_path, env=env, text=True)
    assert where.startswith(str(venv)), where  # the installed copy, not this tree

    # every command's module and its imports load from the wheel: each command's --help, all in one process of the
    # venv (a process each would pay about 4 s of imports apiece)
    helped = subprocess.run([str(venv / "bin" / "python"), "-c", EVERY_HELP], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    from fairseq_headprune.cli import COMMANDS
    assert helped.returncode == 0 and helped.stdout.split() == sorted(COMMANDS), (helped.stdout,
                                                                                  helped.stderr[-2000:])

    command = str(venv / "bin" / "fairseq-headprune")  # the console script the wheel installed
    out = tmp_path / "report"
    proc = subprocess.run([command, "report", str(tiny_data), "--path", str(stock_checkpoint), "--gen-subset",
                           "valid", "--beam", "1", "--results-dir", str(out), "--parts", "score",
                           "--max-tokens", "3000"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "importance.json").exists() and (out / "report.html").exists()
