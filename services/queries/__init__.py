"""StreamReuse's continuous-query service: the HTTP API (`api`), its
client (`client`), the registry and planner behind it (`service`) and the
`streamjoin queries` process (`main`)."""
