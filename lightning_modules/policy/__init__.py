"""Part B: causal-LM policies of a conditional mixture: SFT (`sft.PolicySFTModule`), RL (`rl.PolicyRLModule`:
GRPO / REINFORCE, pure losses in `losses`), shared sampling and evaluation (`base`), verifiable rewards
(`rewards`) and per-distribution mixture metrics (`mixture_metrics`)."""
