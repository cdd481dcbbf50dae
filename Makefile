# Two commands do everything on a fresh machine: `make run` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench fidelity lint wheel-check clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)

# torch is pinned to the local CPU build first, so nothing pulls the multi-GB CUDA wheels.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[dev,optuna,launchers,parquet]"
	touch $(STAMP)

run: $(STAMP)
	WANDB_MODE=offline $(BIN)/pdgym-leaderboard preset=quick

test: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m pytest

bench: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m bench

# Every paper reproduction at full size (hours on 2 cores), judged against its band: writes docs/fidelity.md.
# ONLY=sbs_ttft,pbaa_util runs some; ARGS="workload.trace=PATH" replays another trace in every reproduction.
fidelity: $(STAMP)
	WANDB_MODE=offline $(BIN)/python -m pdgym.agents.experiments.fidelity --only "$(ONLY)" $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check envs baselines agents tests bench

# Builds the wheel, checks it carries every module, config and trace, and runs it without the repo.
wheel-check: $(STAMP)
	$(BIN)/python -m pytest tests/test_packaging.py

clean:
	rm -rf $(VENV) build *.egg-info
