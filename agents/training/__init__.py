"""Training: SB3 / sb3-contrib agents on the pdgym envs, behaviour cloning, feature extractors, callbacks."""
