"""Command-line apps: pdgym-sim and pdgym-repro (train / eval / leaderboard live with their rooms)."""
