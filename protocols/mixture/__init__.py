"""Part B's protocol: SFT then RL stages per seed, then tables over seeds (`python -m protocols.mixture`,
docs/policy_mixtures.md). protocol.py is the command; experiments, stages and report beside it."""
