# Two entry points for a fresh machine (Python 3.11, CPU): `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1

.PHONY: setup demo test clean-venv

setup: $(STAMP)

# torch==2.13.0 is the local CPU build (a looser pin pulls a CUDA build). PyPI's fairseq 0.12.2 no longer
# resolves with a current pip; fairseq-fixed 0.12.3.1 is the same code with Python 3.11 fixes, built from
# source without its declared dependencies (they are in requirements.txt, torchaudio left out) and without
# build isolation (an isolated build would pull a CUDA torch).
$(STAMP): requirements.txt setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/python -c "import fairseq" 2>/dev/null || \
		$(BIN)/pip install -q --no-deps --no-build-isolation fairseq-fixed==0.12.3.1
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	bash recipes/demo.sh

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

clean-venv:
	rm -rf $(VENV)
