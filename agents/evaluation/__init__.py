"""Evaluation: any policy (baseline or trained agent) over seeds through simulate(), and the leaderboard."""
