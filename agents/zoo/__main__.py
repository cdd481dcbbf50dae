"""`python -m pdgym.agents.zoo`: add, list and re-score the shipped agents (curate.py)."""

import sys

from pdgym.agents.zoo.curate import main

sys.exit(main())
