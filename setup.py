"""fairseq-headprune: find, test and remove the attention heads a fairseq Transformer does not need."""
from setuptools import find_packages, setup

setup(
    name="fairseq-headprune",
    version="0.1.0",
    description="Head importance, ablation and pruning (Michel et al. 2019, Voita et al. 2019) for fairseq",
    packages=find_packages(include=["fairseq_headprune", "fairseq_headprune.*"]),
    python_requires=">=3.9",
    # fairseq itself is installed by the Makefile (fairseq-fixed, --no-deps --no-build-isolation): see README
    install_requires=["torch", "sacrebleu>=2.3", "numpy", "scipy", "matplotlib", "compare-mt", "six",
                      "ctranslate2>=4.5,<5"],
    entry_points={"console_scripts": ["fairseq-headprune = fairseq_headprune.cli:main"]},
)
