"""StreamReuse: shared join operators, their relaxation and compensation, the
reuse lattice, the network-usage cost model and the planner that ties them together."""
