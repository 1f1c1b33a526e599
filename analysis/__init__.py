"""Analysis tools: the Proposition 2.1 simulator and the theory <-> experiment bridge (Part B)."""
