"""LightningModules of both parts: `reward/` (Part A: reward models, W2S objectives, ANCHOR, transfer metrics),
`policy/` (Part B: SFT and RL of conditional policy mixtures), `fast/` (speed kernels both use; same numbers as
the plain paths, tested against them)."""
