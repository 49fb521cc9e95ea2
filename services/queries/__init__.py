"""StreamReuse's continuous-query service (seed 002): the HTTP API (`api`), its
client (`client`), the registry and planner behind it (`service`) and the
`streamjoin queries` process (`main`)."""
