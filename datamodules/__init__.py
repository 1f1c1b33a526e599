"""DataModules, one per data family: `preference/` (Part A: preference pairs, hub adapters, the synthetic
preference-shift benchmark, weak labels) and `triggers/` (Part B: trigger prompts of conditional policy mixtures).
`tokenizers` is shared."""
