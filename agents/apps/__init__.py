"""Command-line apps, the top layer of pdgym.agents: pdgym-sim, pdgym-repro, pdgym-leaderboard (it trains and
ranks), pdgym-enjoy, pdgym-profile and make fidelity (pdgym-train and pdgym-eval live with their rooms)."""
