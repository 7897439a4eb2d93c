"""fairseq-headprune: find, test and remove the attention heads a fairseq Transformer does not need."""
from setuptools import find_packages, setup

setup(
    name="fairseq-headprune",
    version="0.1.0",
    description="Head importance, ablation and pruning (Michel et al. 2019, Voita et al. 2019) for fairseq, "
                "and compression of the result for CTranslate2",
    packages=find_packages(include=["fairseq_headprune", "fairseq_headprune.*"]),
    python_requires=">=3.9",
    # fairseq itself is the user's (a plugin installs into the environment that holds it) or the Makefile's
    # (fairseq-fixed, --no-deps --no-build-isolation: see docs/development.md). Everything the commands import, and
    # the tokenizers and BPE codes fairseq loads for --tokenizer moses, --bpe subword_nmt and --bpe sentencepiece:
    install_requires=["torch", "sacrebleu>=2.3,<3", "numpy", "scipy", "matplotlib", "compare-mt", "six", "tqdm",
                      "ctranslate2>=4.5,<5", "sacremoses", "subword-nmt", "sentencepiece"],
    entry_points={"console_scripts": ["fairseq-headprune = fairseq_headprune.cli:main"]},
)
