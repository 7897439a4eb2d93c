# Two entry points for a fresh machine (Python 3.11, CPU): `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1
# test processes, one thread each, one test file per process (pytest-xdist): the 2-core machines run two
TEST_WORKERS ?= 2
# The HTML report is tested in a real headless browser: Debian's chromium (another binary: CHROMIUM=/path make test)
export CHROMIUM ?= /usr/bin/chromium

.PHONY: setup demo test chromium clean-venv

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
# fastBPE (--bpe fastbpe: the WMT'19 releases): PyPI's only sdist, 0.1.0, ships a fastBPE.cpp that Cython 0.28
# generated, which includes longintrepr.h (gone from Python 3.11) and no longer compiles; an isolated build compiles
# that file. Its fastBPE.pyx is turned into C++ again by the venv's Cython (requirements.txt) and built without build
# isolation. The sdist's main.cc, fastBPE's command line (`fastbpe learnbpe N FILE...`: how its codes are learned,
# which the Python module cannot do), is compiled into the venv's bin as `fastbpe` (the tests learn codes with it).
	$(BIN)/python -c "import fastBPE" 2>/dev/null && test -x $(BIN)/fastbpe || { \
		src=$$(mktemp -d) && \
		$(BIN)/pip download -q --no-deps --no-build-isolation --no-binary :all: -d $$src fastBPE==0.1.0 && \
		tar xzf $$src/fastBPE-0.1.0.tar.gz -C $$src && \
		$(BIN)/cython -3 --cplus $$src/fastBPE-0.1.0/fastBPE/fastBPE.pyx && \
		$(BIN)/pip install -q --no-deps --no-build-isolation $$src/fastBPE-0.1.0 && \
		$${CXX:-c++} -std=c++11 -O3 -pthread $$src/fastBPE-0.1.0/fastBPE/main.cc -o $(BIN)/fastbpe && \
		rm -rf $$src; }
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

# the whole study of the bundled De-En model on a 64-sentence slice of its test set (every part; see README, Demo)
demo: $(STAMP)
	bash recipes/demo.sh

# Installs Debian's chromium when it is missing and we are root (CI, the project's machines); otherwise says how,
# and the browser test fails with the same advice (it is never skipped).
chromium:
	@test -x "$(CHROMIUM)" || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium (apt-get) for the HTML report test"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "make: the HTML report test needs Chromium at $(CHROMIUM): sudo apt-get install chromium"; \
	  fi; }

test: $(STAMP) chromium
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

clean-venv:
	rm -rf $(VENV)
