# Three commands do everything on a fresh machine: `make demo` (seconds, once installed), `make run` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo run test explore bench fidelity lint wheel-check ray-check rllib-check tianshou-check clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)

# torch is pinned to the local CPU build first, so nothing pulls the multi-GB CUDA wheels.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[dev,optuna,launchers,parquet,compiled]"
	touch $(STAMP)

# A seconds-long board (two scenarios, two seeds) that prints its tables: the first thing to run.
demo: $(STAMP)
	WANDB_MODE=offline $(BIN)/pdgym-leaderboard preset=demo out_dir=runs/demo

run: $(STAMP)
	WANDB_MODE=offline $(BIN)/pdgym-leaderboard preset=quick

# One pytest worker per core (pytest-xdist), each test file on one worker (its module fixtures built once): on CI's
# 2 cores the suite's ~1,050 s of tests ran in about half that wall time (serial run of 2026-11-27 against -n 2).
test: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m pytest -n auto --dist loadfile

# The property tests on fresh random examples (make test draws the same derandomized ones every run: tests/conftest.py).
explore: $(STAMP)
	WANDB_MODE=offline PDGYM_HYPOTHESIS=explore $(BIN)/python -m pytest -p no:cacheprovider $$(grep -l "from hypothesis" tests/test_*.py)

bench: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m bench

# Every paper reproduction at full size (about an hour on 2 cores), judged against its band: writes docs/fidelity.md
# and its evidence (each run's summary.json and figures) in docs/fidelity/.
# ONLY=sbs_ttft,pbaa_util runs some; ARGS="workload.trace=PATH" replays another trace in every reproduction.
fidelity: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m pdgym.agents.apps.fidelity --only "$(ONLY)" $(ARGS)

# Hydra's Ray launcher, checked in a side environment layered over .venv (hydra-ray-launcher pins
# cloudpickle<3, which joblib 1.6 refuses, so it is not a pdgym extra): two pdgym-sim jobs as Ray tasks on
# a local Ray instance (tests/test_launchers.py). Downloads ray and ~40 packages the first time.
RAY_VENV := .venv-ray
ray-check: $(STAMP)
	test -x $(RAY_VENV)/bin/python || $(PY) -m venv $(RAY_VENV) || python3 -m venv $(RAY_VENV)
	echo 'import site; site.addsitedir("$(abspath $(shell $(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"))")' \
	  > "$$($(RAY_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz_pdgym.pth"
	$(RAY_VENV)/bin/pip install -q hydra-ray-launcher "cloudpickle<3"
	WANDB_MODE=offline $(RAY_VENV)/bin/python -m pytest -p no:cacheprovider tests/test_launchers.py -k ray

# The RL clients that are not pdgym dependencies, each in a side environment layered over .venv like ray-check:
# ray[rllib] moves gymnasium to 1.2.x (so these also run pdgym's tests on the low end of its gymnasium range) and
# tianshou moves pandas to 2.x. rllib-check: PPO with 2 env runners, 1 iteration on a local Ray, the agent evaluated
# by pdgym-eval (agents/training/rllib.py, tests/test_rllib.py; ~600 MB the first time). tianshou-check: the docs'
# Tianshou example (tests/test_tianshou.py). Both also run tests/test_clients.py on their gymnasium.
RLLIB_VENV := .venv-rllib
TIANSHOU_VENV := .venv-tianshou
define side_venv
	test -x $(1)/bin/python || $(PY) -m venv $(1) || python3 -m venv $(1)
	echo 'import site; site.addsitedir("$(abspath $(shell $(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"))")' \
	  > "$$($(1)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz_pdgym.pth"
endef
rllib-check: $(STAMP)
	$(call side_venv,$(RLLIB_VENV))
	nice $(RLLIB_VENV)/bin/pip install -q "ray[rllib]>=2.60,<3"
	WANDB_MODE=offline $(RLLIB_VENV)/bin/python -m pytest -p no:cacheprovider tests/test_rllib.py tests/test_clients.py

tianshou-check: $(STAMP)
	$(call side_venv,$(TIANSHOU_VENV))
	nice $(TIANSHOU_VENV)/bin/pip install -q "tianshou>=2.0,<3"
	WANDB_MODE=offline $(TIANSHOU_VENV)/bin/python -m pytest -p no:cacheprovider tests/test_tianshou.py tests/test_clients.py

lint: $(STAMP)
	$(BIN)/ruff check envs baselines agents tests bench

# Builds the wheel, checks it carries every module, config and trace, and runs it without the repo.
wheel-check: $(STAMP)
	$(BIN)/python -m pytest tests/test_packaging.py

clean:
	rm -rf $(VENV) build *.egg-info
