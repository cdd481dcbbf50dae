"""Trained agents shipped with pdgym (`zoo:NAME`): NAME.zip model archives and index.json, data only.

The store that reads them is agents/learned/zoo_store.py; `python -m pdgym.agents.zoo` (curate.py) adds, lists and
re-scores entries. docs/agents.md, "Zoo".
"""
