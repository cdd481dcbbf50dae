"""Evaluation: any policy (baseline or trained agent) over seeds through simulate(), and the leaderboard's pieces
(runs, statistics, rendering, plots); its app, which also trains agents, is apps/leaderboard.py."""
