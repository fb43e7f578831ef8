"""ALFWorld data: reflections on oracle-plus-random rollouts, then SFT texts."""
