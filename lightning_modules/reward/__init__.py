"""Part A: the reward model (`reward_model.RewardModelModule`), its pure losses (`losses`), the W2S objectives
chosen by config (`objectives`), the scalar head (`heads`), backbone builders (`backbones`) and DDP-exact metrics
(`metrics`: pairwise accuracy, WRG / AOG / NTS / PGR), and the teacher that scores pairs into weak labels
(`weak_labeller`: the data module reads and writes only the label file)."""
